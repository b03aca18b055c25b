"""runtime/web/tokenizer.mjs + unigram.mjs (the browser tokenizer) on MarianMT tokenizers:
the `tokenizers` JSON files export/sources/marian_tokenizer.py writes (a Unigram model,
SentencePiece's Precompiled normaliser, Replace steps with Oniguruma regexes, Metaspace,
special added tokens, a Replace/Metaspace/Fuse decoder) must give Python's ids and text.

Three checkpoint layouts (tests/hf_fixtures.py: one vocabulary and one SentencePiece model,
opus-mt-en-de's two models, separate vocabularies); for each, 2,400 generated texts (accents
composed and not, CJK, emoji sequences, full-width forms, ligatures, NBSP and other spaces,
tabs and newlines, runs of spaces, digits, punctuation, literal special tokens, language codes
`>>xx<<` at the start) through both sides in one node process, and random id sequences
decoded. The Precompiled normaliser alone on grapheme clusters of many scripts, and Metaspace's
other options. Needs Node.js, and sentencepiece, transformers and torch to build the
checkpoints (skipped with the reason otherwise); about 15 s, most of it building them.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest
from test_web_tokenizer import NODE, run_js

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
pytest.importorskip("sentencepiece", reason="needs the hf extra: pip install 'edgeseq[hf]'")
pytest.importorskip("transformers", reason="needs the hf extra: pip install 'edgeseq[hf]'")
pytest.importorskip("torch", reason="the fixtures build a MarianMTModel (the train extra)")

from hf_fixtures import LANGUAGE_CODES, build_marian_dir, synthetic_corpus  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import normalizers, pre_tokenizers  # noqa: E402

from edgeseq.export.sources.marian_tokenizer import (  # noqa: E402
    ESCAPED,
    HIDDEN,
    marian_tokenizers,
    read_spm,
)
from edgeseq.runtime.tokenizer import Tokenizer  # noqa: E402

LAYOUTS = {"shared": {}, "en-de": {"shared_spm": False}, "separate": {"shared_vocab": False}}
N_TEXTS = 2400
N_RANDOM_IDS = 500

# Inserted into the generated texts. Characters SentencePiece's normaliser rewrites (full-width,
# ligatures, fractions, circled and Roman numerals, NBSP and the other spaces, compatibility
# jamo, half-width katakana), grapheme clusters the Precompiled map sees whole or per character
# (decomposed accents, stacked marks, emoji with modifiers and ZWJ, flags, keycaps, Indic
# conjuncts, Hangul jamo, CR LF), characters no vocabulary has, controls, the private-use
# characters the converter writes, and the tokenizers' own markers.
ODD = (
    "é", "e\u0301", "a\u0308\u0301", "n\u0303", "Å", "A\u030a", "ç", "œ", "ß", "ǅ", "İ",
    "漢字", "日本語", "中文", "한국어", "\u1100\u1161\u11a8", "ㄱ", "ﾊﾝｶｸ", "ｶﾞ", "カ\u3099",
    "😀", "🙂👍", "👍🏽", "👨\u200d👩\u200d👧", "🇩🇪", "🏳\ufe0f\u200d🌈", "1\ufe0f\u20e3", "❤\ufe0f",
    "Ｈｅｌｌｏ", "ＡＢＣ１２３", "！？", "ﬁ", "ﬂ", "ﬀ", "ﬃ", "Ĳ", "½", "¾", "①", "⑳", "Ⅻ", "ⅷ",
    "™", "™\x1eg", "㎏", "㍿", "x²", "H₂O", "µ", "Ω", "K", "Å",
    "\u00a0", "\u2002", "\u2009", "\u202f", "\u3000", "\u200b", "\u200c", "\u200d", "\ufeff",
    "\u2028", "\u0085", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\x00", "\x07", "\x1f", "\x7f",
    "क्षत्रिय", "नमस्ते", "ক্ষ", "ਸ਼", "தமிழ்", "ไทย", "ภาษา", "العربية", "עִבְרִית", "ḍ", "ệ",
    "λόγος", "ΟΔΟΣ", "привет", "Ёж", "ё", "й", "и\u0306",
    "...", "—", "–", "«»", "“quoted”", "‘x’", "„", "′", "•", "…", "€", "£", "¥", "©", "®", "°",
    "3.14", "1,000,000", "50%", "(!)", "#1", "@home", "a&b", "~", "`", "^", "|", "\\", "{}",
    HIDDEN, ESCAPED, HIDDEN + ">>deu<<", "\ue123", "▁", "▁▁x", "<", ">", ">>", "<<", "a<<b",
    "x>>deu<<y", "<unk", "unk>", "<s", "</", "<<unk>>", "<<s>", "＜pad＞", "＜/s＞",
)  # fmt: skip
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
CODES = (*LANGUAGE_CODES, ">>xx<<", ">>nld<<", ">> deu <<", ">><<", ">>deu<<<", ">>fra<<>>spa<<")
SPACES = (" ", " ", " ", "  ", "   ", " \t", "\t", "\u00a0", "\u3000", "\n", " \n ")


def generated_texts(n: int, seed: int = 0) -> list[str]:
    """`n` texts: sentences of both synthetic languages with ODD strings, special tokens and
    codes inserted, words joined by assorted spaces; every fifth starts with a code, every
    fifth has spaces around it, every fifth starts with a special token and a code, some are
    only odd characters, and a few are empty or only spaces."""
    rng = random.Random(seed)
    sentences = synthetic_corpus("source", 600, seed=7) + synthetic_corpus("target", 600, seed=7)
    texts = ["", " ", "  ", "\t\n", "<unk>", "<s></s>", ">>deu<<", ">>deu<< ", " >>deu<<"]
    while len(texts) < n:
        i = len(texts)
        if i % 7 == 3:
            words = rng.choices(ODD, k=rng.randint(1, 8))
        else:
            words = rng.choice(sentences).split(" ")
            for pool, rate in ((ODD, 0.7), (SPECIALS, 0.25), (CODES, 0.15)):
                while rng.random() < rate:
                    words.insert(rng.randrange(len(words) + 1), rng.choice(pool))
        glue = "" if rng.random() < 0.1 else None
        text = "".join(w + (glue if glue is not None else rng.choice(SPACES)) for w in words)
        text = text[:-1] if glue is None and rng.random() < 0.7 else text
        if i % 5 == 0:
            text = rng.choice(CODES) + rng.choice(("", " ", "  ", "\t")) + text
        elif i % 5 == 1:
            text = rng.choice(SPACES) + text + rng.choice(SPACES)
        elif i % 5 == 2:
            text = rng.choice(SPECIALS) + rng.choice(CODES) + rng.choice(("", " ")) + text
        texts.append(text)
    return texts


def random_ids(vocab_size: int, n: int, seed: int = 1) -> list[list[int]]:
    """Id sequences: random ids of the whole vocabulary (specials included, so some stop at
    </s>), and runs of the first ids."""
    rng = random.Random(seed)
    out = [[rng.randrange(vocab_size) for _ in range(rng.randint(0, 20))] for _ in range(n)]
    out += [list(range(start, min(start + 40, vocab_size))) for start in range(0, vocab_size, 40)]
    return out


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return generated_texts(N_TEXTS)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A built checkpoint's tokenizer files ({"source", "target"}, one file when shared)."""
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = build_marian_dir(root / "checkpoint", **LAYOUTS[request.param])
    source, target = marian_tokenizers(checkpoint)
    files = {}
    for side, hf in (("source", source), ("target", target)):
        if side == "target" and target is source:
            files["target"] = files["source"]
            continue
        files[side] = root / f"tokenizer.{side}.json"
        files[side].write_text(hf.to_str(), encoding="utf-8")
    return {"name": request.param, "checkpoint": checkpoint, "files": files, "hf": [source, target]}


def mismatches(want: list, got: list, inputs: list) -> list:
    return [(x, w, g) for x, w, g in zip(inputs, want, got, strict=True) if w != g]


def test_generated_texts_cover_the_cases(texts: list[str]) -> None:
    assert len(texts) >= 2000
    counts = {
        "leading code": sum(t.startswith(CODES) for t in texts),
        "special token": sum(any(s in t for s in SPECIALS) for t in texts),
        "emoji": sum(any(e in t for e in ("😀", "👍", "🇩🇪", "👨")) for t in texts),
        "CJK": sum(any(c in t for c in "漢日中한") for t in texts),
        "full-width": sum(any("\uff01" <= c <= "\uff5e" for c in t) for t in texts),
        "decomposed accent": sum(any("\u0300" <= c <= "\u036f" for c in t) for t in texts),
        "ligature": sum(any(c in t for c in "ﬁﬂﬀﬃĲ") for t in texts),
        "NBSP": sum("\u00a0" in t for t in texts),
        "tab or newline": sum("\t" in t or "\n" in t for t in texts),
        "double space": sum("  " in t for t in texts),
        "leading/trailing space": sum(t != t.strip() for t in texts),
        "digits": sum(any(c.isdigit() for c in t) for t in texts),
        "punctuation": sum(any(c in t for c in ".,!?;:") for t in texts),
    }
    assert min(counts.values()) >= 100, counts


def test_ids_and_text_equal_python(layout: dict, texts: list[str]) -> None:
    files = list(dict.fromkeys(layout["files"].values()))
    python = {f: Tokenizer.load(f) for f in files}  # what runtime/tokenizer.py runs
    want_ids = {f: [python[f].encode(t) for t in texts] for f in files}
    for f, hf in zip(files, layout["hf"], strict=False):  # the file gives the objects' ids
        direct = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        assert not mismatches(direct, want_ids[f], texts)
    ids = {f: want_ids[f] + random_ids(python[f].vocab_size, N_RANDOM_IDS) for f in files}
    got = run_js({f: {"encode": texts, "decode": ids[f]} for f in files})
    report = {}
    for f in files:
        assert "error" not in got[f], got[f]
        wrong_ids = mismatches(want_ids[f], got[f]["ids"], texts)
        want_text = [python[f].decode(i) for i in ids[f]]
        wrong_text = mismatches(want_text, got[f]["decoded"], ids[f])
        report[f.name] = (len(wrong_ids), len(wrong_text), wrong_ids[:3], wrong_text[:3])
    assert all(r[0] == r[1] == 0 for r in report.values()), report
    assert sum(3 in i for i in want_ids[files[0]]) >= 100  # <unk> is exercised


def charsmap_texts(seed: int = 2) -> list[str]:
    """Short strings of ODD clusters, random code points of many blocks, and combining marks
    after every kind of base: what the Precompiled map sees as whole clusters or characters."""
    rng = random.Random(seed)
    blocks = [(0x20, 0x7F), (0xA0, 0x250), (0x300, 0x370), (0x370, 0x530), (0x900, 0xE00),
              (0x1100, 0x1200), (0x1E00, 0x2000), (0x2000, 0x2800), (0x3000, 0x3100),
              (0x3200, 0x3400), (0x4E00, 0x4F00), (0xAC00, 0xAD00), (0xF900, 0xFB50),
              (0xFE00, 0xFFF0), (0x1D400, 0x1D800), (0x1F100, 0x1F700)]  # fmt: skip
    marks = "\u0301\u0308\u0303\u030a\u0327\u0323\u0345\u20e3\ufe0f\u200d\u093c\u094d\u3099"
    out = []
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(ODD))
            else:
                lo, hi = rng.choice(blocks)
                point = rng.randrange(lo, hi)
                if 0xD800 <= point < 0xE000:
                    continue
                parts.append(chr(point) + "".join(rng.choices(marks, k=rng.choice((0, 0, 1, 2)))))
        out.append("".join(parts))
    return out


def test_precompiled_normalizer_equals_python(layout: dict, tmp_path: Path) -> None:
    spm = read_spm(layout["checkpoint"] / "source.spm")
    charsmap = normalizers.Precompiled(spm.charsmap)
    data = json.loads(Path(layout["files"]["source"]).read_text(encoding="utf-8"))
    data["normalizer"] = {
        "type": "Precompiled",
        "precompiled_charsmap": base64.b64encode(spm.charsmap).decode("ascii"),
    }
    path = tmp_path / "precompiled.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    samples = charsmap_texts()
    got = run_js({path: {"normalize": samples}})[path]
    assert "error" not in got, got
    want = [charsmap.normalize_str(t) for t in samples]
    wrong = mismatches(want, got["normalized"], samples)
    assert not wrong, f"{len(wrong)}/{len(samples)} differ, e.g. {wrong[:5]}"
    assert sum(w != t for w, t in zip(want, samples, strict=True)) > 1000  # it rewrites


@pytest.mark.parametrize(
    "scheme,split", [("always", True), ("always", False), ("first", True), ("never", False)]
)
def test_metaspace_options_equal_python(
    layout: dict, texts: list[str], tmp_path: Path, scheme: str, split: bool
) -> None:
    hf = HFTokenizer.from_str(Path(layout["files"]["source"]).read_text(encoding="utf-8"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)
    if scheme == "first":  # only without a normaliser (see the next test)
        hf.normalizer = None
    path = tmp_path / "metaspace.json"
    path.write_text(hf.to_str(), encoding="utf-8")
    sample = texts[:600]
    want = [e.ids for e in hf.encode_batch(sample, add_special_tokens=False)]
    got = run_js({path: {"encode": sample}})[path]
    assert "error" not in got, got
    wrong = mismatches(want, got["ids"], sample)
    assert not wrong, f"{len(wrong)}/{len(sample)} differ, e.g. {wrong[:3]}"


def test_metaspace_first_after_a_normalizer_is_refused(layout: dict, tmp_path: Path) -> None:
    # tokenizers prepends where the piece's first character is aligned to the input's first:
    # '>>xx<< The' normalises to HIDDEN + ' The', aligned past the code, and gets no ▁.
    hf = HFTokenizer.from_str(Path(layout["files"]["source"]).read_text(encoding="utf-8"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    assert hf.encode(">>xx<< The", add_special_tokens=False).tokens[0] == HIDDEN
    path = tmp_path / "first.json"
    path.write_text(hf.to_str(), encoding="utf-8")
    got = run_js({path: {"encode": ["abc"]}})[path]
    assert "prepend_scheme first is supported alone" in got.get("error", ""), got
