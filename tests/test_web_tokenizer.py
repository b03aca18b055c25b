"""runtime/web/tokenizer.mjs (the browser tokenizer) against runtime/tokenizer.py.

Each case saves a tokenizer (char or word, with a normalizer such as the NFC + Lowercase that
a g2p bundle declares) and compares the JavaScript ids and decoded text with Python's on texts
chosen to break a careless port: composed and decomposed accents, capitals that lowercase to
two code points, final sigma, surrounding spaces, symbols outside the vocabulary. Then the
parts the imported (Unigram) tokenizers use, on small files made here: Oniguruma regexes
rewritten for JavaScript (Replace), Split's delimiter behaviours, and the decoders (Metaspace,
Replace, Fuse, Strip); tests/test_web_unigram.py runs MarianMT's whole files. Needs only
Node.js (skipped with the reason when it is absent); about a second per case.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from edgeseq.runtime.tokenizer import Tokenizer, build_normalizer

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
HELPER = Path(__file__).parent / "edge" / "encode.mjs"
WEB = Path(__file__).resolve().parent.parent / "runtime" / "web" / "tokenizer.mjs"

TEXTS = [
    "hello",
    "Hello",
    "ÉCOLE",
    "e\u0301cole",  # e + combining acute: NFC composes it
    "ﬁne",  # U+FB01 ligature: NFKC splits it
    "İstanbul",  # lowercases to i + combining dot
    "ΟΔΟΣ",  # final sigma
    "  padded  ",
    "a b\tc",
    "don't",
    "x<unk>y",
    "",
    "straße",
    "123 ?!",
    "\ufeffbom\u0085",  # U+FEFF is not White_Space, U+0085 is: String.trim disagrees
    "\u3000wide\u2003",
]


def js_encode(path: Path, texts: list[str]) -> list[dict] | dict:
    """ids and decoded text of each text from the JavaScript tokenizer (or {"error": ...})."""
    result = subprocess.run(
        [NODE, str(HELPER), str(path)], input=json.dumps(texts), capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(result.stdout)


CORPUS = ["hello ecole istanbul odos strasse don't fine padded abc", "ÉCOLE éσςß ΟΔΟΣ İ 123?!"]
NORMALIZERS = {
    "none": None,
    "nfc-lowercase": normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]),
    "nfkc-strip": normalizers.Sequence([normalizers.NFKC(), normalizers.Strip()]),
    "nfd-stripaccents-lower": normalizers.Sequence(
        [normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()]
    ),
    "replace-prepend": normalizers.Sequence(
        [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Prepend("^")]
    ),
    "strip-left": normalizers.Strip(left=True, right=False),
    "g2p": build_normalizer(("nfc", "strip", "lowercase")),  # what the g2p task trains with
}


@pytest.mark.parametrize("kind", ["char", "word"])
@pytest.mark.parametrize("normalizer", sorted(NORMALIZERS))
def test_ids_and_text_equal_python(tmp_path: Path, kind: str, normalizer: str) -> None:
    tok = Tokenizer.train(kind, [*CORPUS, *TEXTS])
    if NORMALIZERS[normalizer] is not None:
        tok.hf.normalizer = NORMALIZERS[normalizer]
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    got = js_encode(path, TEXTS)
    want = [{"ids": tok.encode(t), "text": tok.decode(tok.encode(t))} for t in TEXTS]
    assert got == want


def test_whitespace_pretokenizer_sequence_equals_python(tmp_path: Path) -> None:
    tok = Tokenizer.train_word(CORPUS)
    tok.hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Whitespace()]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    got = js_encode(path, TEXTS)
    assert [g["ids"] for g in got] == [tok.encode(t) for t in TEXTS]


def test_unknown_normalizer_is_refused(tmp_path: Path) -> None:
    tok = Tokenizer.train_char(CORPUS)
    data = json.loads(tok.to_str())
    data["normalizer"] = {"type": "BertNormalizer", "clean_text": True}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    got = js_encode(path, ["abc"])
    assert "error" in got
    assert 'normalizer "BertNormalizer" is not supported' in got["error"]
    data["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": ""}  # tokenizers too
    path.write_text(json.dumps(data), encoding="utf-8")
    assert "precompiled_charsmap is truncated" in js_encode(path, ["abc"]).get("error", "")


def test_bpe_dropout_is_refused(tmp_path: Path) -> None:
    tok = Tokenizer.train_bpe(CORPUS * 5, vocab_size=60)
    data = json.loads(tok.to_str())
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    assert js_encode(path, ["abc"])[0]["ids"] == tok.encode("abc")
    data["model"]["dropout"] = 0.1
    path.write_text(json.dumps(data), encoding="utf-8")
    got = js_encode(path, ["abc"])
    assert "error" in got
    assert "BPE model with dropout 0.1 is not supported" in got["error"]


# -- the parts imported tokenizers use ------------------------------------------------------

# Encode, decode, normalise and pre-tokenise with each tokenizer file, all in one node process.
JS = """
import { readFileSync } from "node:fs";
const { Tokenizer } = await import(process.argv[1]);
const jobs = JSON.parse(readFileSync(0, "utf8"));
const out = {};
for (const [file, job] of Object.entries(jobs)) {
  try {
    const data = JSON.parse(readFileSync(file, "utf8"));
    const tok = Tokenizer.fromJSON(data, { bundle: job.bundle ?? true });
    out[file] = {
      ids: (job.encode ?? []).map((t) => tok.encode(t)),
      with_specials: (job.encode_special ?? []).map((t) => tok.encode(t, true)),
      decoded: (job.decode ?? []).map((ids) => tok.decode(ids)),
      normalized: (job.normalize ?? []).map((t) => tok.normalize(t)),
      pieces: (job.pre_tokenize ?? []).map((t) => tok.preTokenize(t, true)),
      unk_id: tok.unkId,
    };
  } catch (err) {
    out[file] = { error: `${err.name}: ${err.message}` };
  }
}
process.stdout.write(JSON.stringify(out));
"""


def run_js(jobs: dict[Path, dict[str, list]]) -> dict[Path, dict]:
    """{file: {"encode": texts, "encode_special": texts, "decode": id lists, "normalize": texts,
    "pre_tokenize": texts, "bundle": false to run a file not in edgeseq ids}} -> {file: {"ids",
    "with_specials" (the post-processor's), "decoded", "normalized", "pieces", "unk_id"} or
    {"error"}}."""
    result = subprocess.run(
        [NODE, "--input-type=module", "-e", JS, WEB.as_uri()],
        input=json.dumps({str(f): job for f, job in jobs.items()}), capture_output=True,
        text=True, encoding="utf-8", check=True, timeout=300,
    )  # fmt: skip
    return {Path(f): v for f, v in json.loads(result.stdout).items()}


def bare() -> HFTokenizer:
    """A WordLevel tokenizer of the four specials only, to attach one part to."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"])}
    return HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))


def save(hf: HFTokenizer, path: Path) -> Path:
    path.write_text(hf.to_str(), encoding="utf-8")
    return path


REGEX_TEXTS = [
    "", "a", "aab", "ab\nab\n", "a\nab\na", "\nab", "abc abc", "x  y\t z\n", " lead", "trail ",
    "é e\u0301 É", "٣ 3 ５ ²", "a_b-c", "x\u0085y\ufeffz\u00a0w\u3000v\u200b", "😀 a😀b",
    "\r\n", "q>>deu<< x", " >>fra<< y", ">>deu<<", "a{b}c", "#1 & ~2", "Ωmega αβγ 漢字",
]  # fmt: skip
REGEXES = [
    r"^a", r"a$", r"\A", r"\z", r"\Z", r"^", r"$", r"\d", r"\D+", r"\w+", r"\W", r"\s+", r"\S",
    r"\h", r"\b", r"\B", r".", r"b*", r"x*", r"", r"\x{E9}", r"[\x{61}-\x{63}]+", r"\p{L}+",
    r"\p{^L}", r"\P{Lu}", r"\p{Greek}", r"(?<=a)b", r"(?<!a)b", r"a{2}", r"a{,2}", r"a{",
    r"\#|\&|\~", r"[\s\S]{2,}", r"[^\x{20}-\x{7E}]{2,}", r"(?:ab|a)c?", r"\A (?=>>(?:deu|fra)<<)",
    r"(?<=\Aq>>deu|\Aq>>fra)<<", r"\A >>[\s\S]*?<<", r" +\z", r" {2,}", r"[]a]", r"(?#note)a",
    r"\t|\n", r"[\s]", r"[^\S\n]+", r"a}",
]  # fmt: skip


def test_replace_regexes_equal_python(tmp_path: Path) -> None:
    """Oniguruma's anchors (^ $ per line, \\A \\z \\Z), Unicode \\d \\w \\s \\b, \\x{..},
    lookbehind, empty matches (skipped right after a match), literal braces."""
    jobs, want = {}, {}
    for i, pattern in enumerate([*REGEXES, "a.b", "\\", "(x)"]):
        regex = i < len(REGEXES)
        step = normalizers.Replace(Regex(pattern) if regex else pattern, "<X>")
        hf = bare()
        hf.normalizer = step
        path = save(hf, tmp_path / f"replace{i}.json")
        texts = [*REGEX_TEXTS, "a.b a\\b (x)"]
        jobs[path] = {"normalize": texts}
        want[path] = (pattern, [step.normalize_str(t) for t in texts])
    got = run_js(jobs)
    wrong = {want[p][0]: got[p] for p in jobs if got[p].get("normalized") != want[p][1]}
    assert not wrong, wrong


@pytest.mark.parametrize(
    "pattern", [r"(?i)a", r"[[:alpha:]]", r"(?>a)", r"\G", r"[a-z&&[^b]]", r"\K", r"\101"]
)
def test_regexes_javascript_cannot_run_are_refused(tmp_path: Path, pattern: str) -> None:
    hf = bare()
    hf.normalizer = normalizers.Replace(Regex(pattern), "X")
    path = save(hf, tmp_path / "tokenizer.json")
    assert "is not supported" in run_js({path: {"normalize": ["abc"]}})[path].get("error", "")


def test_split_behaviours_equal_python(tmp_path: Path) -> None:
    texts = ["the-final--countdown", "-a-", "--", "", "a", "x - y -- z", "aXbXXc", "aaa"]
    jobs, want = {}, {}
    for pattern in ["-", Regex("-+"), Regex(r"\s"), Regex("X|-"), Regex("b*")]:
        for behavior in ["removed", "isolated", "merged_with_previous", "merged_with_next",
                         "contiguous"]:  # fmt: skip
            for invert in (False, True):
                step = pre_tokenizers.Split(pattern, behavior, invert=invert)
                hf = bare()
                hf.pre_tokenizer = step
                path = save(hf, tmp_path / f"split{len(jobs)}.json")
                jobs[path] = {"pre_tokenize": texts}
                want[path] = [[p for p, _ in step.pre_tokenize_str(t)] for t in texts]
    got = run_js(jobs)
    wrong = {json.loads(p.read_text())["pre_tokenizer"].__repr__(): got[p] for p in jobs
             if got[p].get("pieces") != want[p]}  # fmt: skip
    assert not wrong, wrong


DECODERS = {
    "metaspace-always": decoders.Metaspace(prepend_scheme="always"),
    "metaspace-never": decoders.Metaspace(prepend_scheme="never"),
    "metaspace-first": decoders.Metaspace(prepend_scheme="first"),
    "marian": decoders.Sequence(
        [
            decoders.Replace("\ue000", ""),
            decoders.Metaspace(prepend_scheme="always"),
            decoders.Fuse(),
            decoders.Replace(Regex(r"\A\s+|\s+\z"), ""),
        ]
    ),
    "llama": decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    ),
    "strip-pieces": decoders.Sequence([decoders.Strip("x", 0, 1), decoders.Strip("▁", 2, 0)]),
    "none": None,
}


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoders_equal_python(tmp_path: Path, name: str) -> None:
    pieces = ["▁a", "b▁c", "▁▁", "▁", "x", "xx▁", "a x", " ", "\ue000▁de", "é", "▁▁▁x"]
    vocab = [(t, 0.0) for t in ("<pad>", "<s>", "</s>", "<unk>", *pieces)]
    hf = HFTokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    hf.decoder = DECODERS[name]
    path = save(hf, tmp_path / "tokenizer.json")
    rng = random.Random(0)
    ids = [[rng.randrange(len(vocab)) for _ in range(rng.randint(0, 6))] for _ in range(400)]
    python = Tokenizer(hf, "unigram")
    got = run_js({path: {"decode": ids}})[path]
    assert got.get("decoded") == [python.decode(i) for i in ids], got.get("error")


# -- every string a client can send (issue 39) ------------------------------------------------
HOSTILE = [
    "\ud800", "a\udfffb", "\udc80\ud800x", "\x00", "a\x00b", "\u202eabc\u202c", "\u2066x\u2069",
    "e\u0301\u0301\u0301", "ＡＢＣ ｊｉｈ", "\ufb01", "\u00a0a\u00a0", "😀" * 1000, "\U0010ffff",
    "\ufeff", "<pad>", "</s>", "\x85", "\ud83d\ude00", "a\u200db", "\u0000\u0000",
]  # fmt: skip


@pytest.mark.parametrize("kind", ["char", "word"])
def test_hostile_strings_encode_as_python_reads_them(tmp_path: Path, kind: str) -> None:
    """What the browser runtime tokenizes equals what the Python runtime tokenizes (an
    unpaired surrogate, which JSON and JavaScript strings can carry, read as U+FFFD on both
    sides), for arbitrary Unicode as well as the classes clients send on purpose."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from edgeseq.runtime.tokenizer import utf8_text

    tok = Tokenizer.train(kind, [*CORPUS, *TEXTS, "😀 ａ 日本"])
    tok.hf.normalizer = NORMALIZERS["g2p"]
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    drawn: list[str] = []

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.text(st.characters(codec=None, exclude_categories=()), max_size=20))
    def collect(text: str) -> None:
        drawn.append(text)

    collect()
    texts = [*HOSTILE, *drawn]
    got = js_encode(path, texts)  # one node process for all of them
    want = [tok.encode(utf8_text(t)) for t in texts]
    for text, g, w in zip(texts, got, want, strict=True):
        assert g["ids"] == w, repr(text)
