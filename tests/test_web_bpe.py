"""runtime/web/bpe.mjs + specials.mjs (the browser tokenizer's BPE model, byte-level pieces,
post-processors) against the `tokenizers` library, on files trained here (no downloads):

- a byte-level BPE (GPT-2/RoBERTa/BART layout: ByteLevel pre-tokenizer and decoder,
  RobertaProcessing with <s> </s>) under each ByteLevel option and both serialisations of
  `merges`; and the same model saved by transformers' BartTokenizerFast (its tokenizer.json
  in its own ids, and renumbered into edgeseq ids as an import writes it);
- SentencePiece-style BPEs (Metaspace; unknowns fused or not, byte_fallback with the
  ByteFallback decoder, ignore_merges, a continuing-subword prefix and end-of-word suffix),
  saved as a bundle holds them; and NLLB's layout (a SentencePiece BPE model converted by
  transformers' NllbTokenizer: Precompiled normaliser, TemplateProcessing) raw and renumbered.

On ~200 texts (accents, Greek, CJK, emoji, digits, punctuation, runs of spaces, literal special
tokens, characters no training text had) the browser's ids, with and without the
post-processor's special tokens, equal Python's, and its decoding of those ids and of random
ids equals Python's. Unsupported options are refused with one error naming them. Needs
Node.js; ~20 s.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_web_tokenizer import NODE, run_js
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from edgeseq.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")

SEEN = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "naïve", "café", "façade",
    "Straße", "œuvre", "e\u0301cole", "λόγος", "καλή", "ΟΔΟΣ", "東京", "日本語", "中文", "😀",
    "👍🏽", "🇩🇪", "123", "4,5", "2026", "42%", "don't", "it's", "we'll", "(hi)", "!?", "...",
    "—", "«x»", "a.b", "€5",
)  # fmt: skip
UNSEEN = (
    "Привет", "мир", "العربية", "नमस्ते", "ไทย", "한국어", "🦀", "ǅ", "Ω", "\u00a0", "\u3000",
    "\ufeff", "ﬁ", "Ｈｅｌｌｏ", "\x00", "▁", "Ġ", "<0x41>", "##", "</w>", "𝔘",
)  # fmt: skip
SPECIAL_TEXTS = ("<s>", "</s>", "<unk>", "<pad>", "<mask>", "eng_Latn", "fra_Latn")
SPACES = (" ", " ", " ", "  ", "   ", "\t", " \n", "")
BART_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # BART's ids 0..4
EDGESEQ_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # a bundle's ids 0..3


def sentences(n: int, pools: tuple[tuple[str, ...], ...], seed: int) -> list[str]:
    """`n` lines of 1..12 words drawn from `pools` (one pool per word, uniformly), joined by
    assorted spaces, some with spaces around them."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 12))]
        text = "".join(w + rng.choice(SPACES) for w in words)
        out.append(rng.choice(SPACES) + text if rng.random() < 0.3 else text.rstrip(" "))
    return out


CORPUS = sentences(400, (SEEN,), seed=0)
EDGES = ["", " ", "  ", "\t\n", "<s>", "a<mask> b"]
TEXTS = [*EDGES, *sentences(200 - len(EDGES), (SEEN, UNSEEN, SPECIAL_TEXTS), seed=1)]


def test_texts_cover_the_cases() -> None:
    seen_chars = set("".join(CORPUS))
    counts = {
        "unseen character": sum(any(c not in seen_chars for c in t) for t in TEXTS),
        "Greek": sum(any("\u0370" <= c <= "\u03ff" for c in t) for t in TEXTS),
        "CJK": sum(any(c in t for c in "東日中") for t in TEXTS),
        "emoji": sum(any(e in t for e in ("😀", "👍", "🇩🇪", "🦀")) for t in TEXTS),
        "digits": sum(any(c.isdigit() for c in t) for t in TEXTS),
        "double space": sum("  " in t for t in TEXTS),
        "special token": sum(any(s in t for s in SPECIAL_TEXTS) for t in TEXTS),
    }
    assert len(TEXTS) == 200
    assert min(counts.values()) >= 25, counts


def random_ids(vocab_size: int, n: int = 300, seed: int = 2) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(rng.randint(0, 12))] for _ in range(n)]


def assert_browser_equals(path: Path, *, bundle: bool, source_ids: list[list[int]] | None = None):
    """The browser's ids (without and with special tokens) and decoded text equal Python's for
    the file at `path`: `tokenizers` for any file, edgeseq's runtime Tokenizer for a bundle's.
    `source_ids`: the source tokenizer's ids with special tokens, when it is not `tokenizers`."""
    hf = HFTokenizer.from_file(str(path))
    plain = [e.ids for e in hf.encode_batch(TEXTS, add_special_tokens=False)]
    special = source_ids or [e.ids for e in hf.encode_batch(TEXTS)]
    ids = plain + special + random_ids(hf.get_vocab_size())
    if bundle:
        runtime = Tokenizer.load(path)
        assert [runtime.encode(t) for t in TEXTS] == plain
        want_text = [runtime.decode(i) for i in ids]
    else:
        want_text = hf.decode_batch(ids)  # skip_special_tokens, as the browser decodes
    job = {"encode": TEXTS, "encode_special": TEXTS, "decode": ids, "bundle": bundle}
    got = run_js({path: job})[path]
    assert "error" not in got, got
    if bundle:  # the id whose inputs are not run ("unknown only"), even without a model unk
        assert got["unk_id"] == runtime.unk_id == 3
    for name, want, have, inputs in (
        ("ids", plain, got["ids"], TEXTS),
        ("ids with specials", special, got["with_specials"], TEXTS),
        ("text", want_text, got["decoded"], ids),
    ):
        wrong = [(x, w, g) for x, w, g in zip(inputs, want, have, strict=True) if w != g]
        assert not wrong, f"{name}: {len(wrong)}/{len(inputs)} differ, e.g. {wrong[:3]}"
    return plain


# -- byte-level BPE (GPT-2, RoBERTa, BART) ----------------------------------------------------


@pytest.fixture(scope="module")
def byte_level() -> HFTokenizer:
    """A byte-level BPE in BART's ids, RobertaProcessing adding <s> ... </s>."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=BART_SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    hf.train_from_iterator(CORPUS, trainer)
    hf.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return hf


@pytest.mark.parametrize("merges", ["pairs", "strings"])
@pytest.mark.parametrize("prefix_space,use_regex", [(False, True), (True, True), (False, False)])
def test_byte_level_bpe_equals_python(
    byte_level: HFTokenizer, tmp_path: Path, prefix_space: bool, use_regex: bool, merges: str
) -> None:
    data = json.loads(byte_level.to_str())
    data["pre_tokenizer"] = json.loads(
        pre_tokenizers.ByteLevel(add_prefix_space=prefix_space, use_regex=use_regex).__getstate__()
    )
    assert isinstance(data["model"]["merges"][0], list)
    if merges == "strings":
        data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    plain = assert_browser_equals(path, bundle=False)
    assert sum(len(i) for i in plain) < sum(len(t.encode()) for t in TEXTS) * 0.7  # it merges


def test_bart_layout_equals_transformers(byte_level: HFTokenizer, tmp_path: Path) -> None:
    """BartTokenizerFast's saved tokenizer.json (a <mask> that takes the space before it, as
    BART's has) in its own ids, and renumbered into edgeseq ids as an import writes it."""
    from transformers import BartTokenizerFast

    from edgeseq.export.sources.renumber import read_vocabulary

    data = json.loads(byte_level.to_str())
    for token in data["added_tokens"]:
        token["lstrip"] = token["content"] == "<mask>"
    source = BartTokenizerFast(tokenizer_object=HFTokenizer.from_str(json.dumps(data)))
    source.save_pretrained(tmp_path / "bart")
    path = tmp_path / "bart" / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert [t["lstrip"] for t in data["added_tokens"] if t["content"] == "<mask>"] == [True]
    assert data["post_processor"]["type"] == "RobertaProcessing"
    assert source("a <mask> b")["input_ids"][1:-1] == source("a<mask> b")["input_ids"][1:-1]
    source_ids = [source(t)["input_ids"] for t in TEXTS]
    assert_browser_equals(path, bundle=False, source_ids=source_ids)
    specials = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    renumbered = read_vocabulary(path, specials).tokenizer()
    assert (renumbered.id_to_token(0), source.convert_ids_to_tokens(0)) == ("<pad>", "<s>")
    renumbered.save(tmp_path / "bundle.json")
    assert_browser_equals(tmp_path / "bundle.json", bundle=True)


# -- SentencePiece-style BPE (Metaspace; NLLB, M2M-100) --------------------------------------

VARIANTS = {
    "fused-unk": {"fuse_unk": True},
    "unfused-unk": {"fuse_unk": False},
    "byte-fallback": {"fuse_unk": True, "byte_fallback": True},
    "ignore-merges": {"fuse_unk": True, "ignore_merges": True},
    "prefix-suffix": {"continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"},
}


def spm_style_bpe(variant: str) -> HFTokenizer:
    """A BPE trained here with edgeseq's special tokens first: Metaspace and NFKC, or (the
    prefix-suffix variant) Whitespace words with `##` / `</w>` pieces."""
    options = dict(VARIANTS[variant])
    affixes = {k: options.pop(k) for k in ("continuing_subword_prefix", "end_of_word_suffix")
               if k in options}  # fmt: skip
    hf = HFTokenizer(models.BPE(unk_token="<unk>", fuse_unk=options.pop("fuse_unk", False)))
    if affixes:
        hf.pre_tokenizer = pre_tokenizers.Whitespace()
    else:
        hf.normalizer = normalizers.NFKC()
        hf.pre_tokenizer = pre_tokenizers.Metaspace()
        hf.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=EDGESEQ_SPECIALS, show_progress=False, **affixes
    )
    hf.train_from_iterator(CORPUS, trainer)
    data = json.loads(hf.to_str())
    if options.get("byte_fallback"):  # SentencePiece's <0x00>..<0xFF> pieces, in the model
        vocab = data["model"]["vocab"]
        vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})
        data["decoder"] = json.loads(
            decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()]).__getstate__()
        )
    data["model"].update(options)
    return HFTokenizer.from_str(json.dumps(data))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sentencepiece_style_bpe_equals_python(tmp_path: Path, variant: str) -> None:
    hf = spm_style_bpe(variant)
    path = tmp_path / "tokenizer.json"
    Tokenizer(hf, "bpe").save(path)  # as a bundle holds it
    plain = assert_browser_equals(path, bundle=True)
    unknown = sum(3 in i for t, i in zip(TEXTS, plain, strict=True) if "<unk>" not in t)
    if variant == "byte-fallback":
        assert unknown == 0
        assert sum(t.startswith("<0x") for i in plain for t in map(hf.id_to_token, i)) >= 100
    else:
        assert unknown >= 30  # unseen characters are unknown


def test_nllb_layout_equals_transformers(tmp_path: Path) -> None:
    """NllbTokenizer's tokenizer.json (SentencePiece BPE converted by transformers: Precompiled
    normaliser, Metaspace, TemplateProcessing with the source language) in its own ids, and
    renumbered into edgeseq ids as the M2M-100 import writes it."""
    pytest.importorskip("sentencepiece", reason="needs the hf extra: pip install 'edgeseq[hf]'")
    from m2m_fixtures import LANGUAGES, train_bpe_spm
    from transformers import NllbTokenizer

    from edgeseq.export.sources.m2m_100_tokenizer import m2m_tokenizer

    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / "sentencepiece.bpe.model").write_bytes(train_bpe_spm(CORPUS, 300))
    source = NllbTokenizer.from_pretrained(
        str(tmp_path / "spm"), additional_special_tokens=list(LANGUAGES), src_lang="eng_Latn"
    )
    source.save_pretrained(tmp_path / "nllb")
    path = tmp_path / "nllb" / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["model"]["type"] == "BPE"
    assert "Precompiled" in json.dumps(data["normalizer"])
    assert data["post_processor"]["type"] == "TemplateProcessing"
    assert_browser_equals(path, bundle=False, source_ids=[source(t)["input_ids"] for t in TEXTS])
    bundle, _, _ = m2m_tokenizer(tmp_path / "nllb", len(source))
    bundle.save(tmp_path / "bundle.json")
    assert_browser_equals(tmp_path / "bundle.json", bundle=True)


# -- refusals -----------------------------------------------------------------------------

REFUSED = {
    "dropout": (("model", "dropout"), 0.1, "BPE model with dropout 0.1 is not supported"),
    "merge": (("model", "merges"), ["x qq"], 'merge token "qq" is not in the vocab'),
    "merges": (("model", "merges"), ["a b c"], 'merge 1 "a b c" is not "a b"'),
    "post-processor": (
        ("post_processor",), {"type": "BertLike"}, 'post-processor "BertLike" is not supported'
    ),
    "decoder": (("decoder",), {"type": "BPEDecoder", "suffix": "</w>"}, '"BPEDecoder" is not'),
    "template": (
        ("post_processor",),
        {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "B", "type_id": 0}}],
         "pair": [], "special_tokens": {}},
        "a single-sequence template may only use $A",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_options_are_refused(tmp_path: Path, case: str) -> None:
    keys, value, message = REFUSED[case]
    data = json.loads(spm_style_bpe("fused-unk").to_str())
    data["model"]["vocab"]["x"] = len(data["model"]["vocab"])
    target = data
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    got = run_js({path: {"encode": ["abc"]}})[path]
    assert message in got.get("error", ""), got
    assert got["error"].startswith("TokenizerError: ")


def test_hostile_strings_equal_python(byte_level: HFTokenizer, tmp_path: Path) -> None:
    """Any string a client sends (unpaired surrogates read as U+FFFD on both sides, controls,
    marks, the byte-level alphabet itself) gives Python's ids through a byte-level BPE."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from test_web_tokenizer import HOSTILE

    from edgeseq.runtime.tokenizer import utf8_text

    drawn: list[str] = []

    @settings(max_examples=200, deadline=None, database=None)
    @given(st.text(st.characters(codec=None, exclude_categories=()), max_size=20))
    def collect(text: str) -> None:
        drawn.append(text)

    collect()
    texts = [*HOSTILE, "ĠġĊ", "Ġ Ġ", "'s'S 'll", *drawn]
    path = tmp_path / "tokenizer.json"
    path.write_text(byte_level.to_str(), encoding="utf-8")
    want = [byte_level.encode(utf8_text(t), add_special_tokens=False).ids for t in texts]
    got = run_js({path: {"encode": texts, "bundle": False}})[path]
    assert "error" not in got, got
    wrong = [(t, w, g) for t, w, g in zip(texts, want, got["ids"], strict=True) if w != g]
    assert not wrong, wrong[:3]
