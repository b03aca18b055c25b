"""MarianMT's tokenizers as `tokenizers` objects (export/sources/marian_tokenizer.py) against
transformers' MarianTokenizer, on tiny checkpoints built here (tests/hf_fixtures.py) in three
layouts: one vocabulary and one SentencePiece model, opus-mt-en-de's (one vocabulary, two
models) and separate vocabularies. The same ids on 2,400 generated texts per side, in Marian's
numbering and in edgeseq's; the same decoded text for generated and random ids; the runtime's
Tokenizer accepts the result; and the errors.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sentencepiece", reason="needs the hf extra: pip install 'edgeseq[hf]'")
pytest.importorskip("transformers", reason="needs the hf extra: pip install 'edgeseq[hf]'")
pytest.importorskip("torch", reason="the fixtures build a MarianMTModel (the train extra)")

from hf_fixtures import LANGUAGE_CODES, build_marian_dir, synthetic_corpus

from edgeseq.export.sources.marian_tokenizer import (
    HIDDEN,
    marian_tokenizers,
    read_spm,
    to_edgeseq_ids,
    to_marian_ids,
)
from edgeseq.runtime.errors import MissingDependencyError, TokenizerError
from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

LAYOUTS = {"shared": {}, "en-de": {"shared_spm": False}, "separate": {"shared_vocab": False}}
N_TEXTS = 2400
# Inserted into the generated texts: characters no vocabulary has (emoji, CJK), ones the
# normaliser rewrites (full-width, ligatures, NBSP, ideographic space, tabs, newlines,
# combining accents), the private-use character the converter writes, angle brackets.
ODD = (
    "😀", "🙂👍", "漢字", "Ｈｅｌｌｏ", "ﬁ", "½", "①", "e\u0301", "\u00a0", "\u3000", "\t", "\n",
    "\u200b", "Ⅻ", "ﾊﾝｶｸ", "＜pad＞", "«»", "“quoted”", "—", "...", HIDDEN, "<", ">>", "<<",
    "a<<b", "x>>deu<<y", "3.14", "1,000,000", "50%", "(!)",
)  # fmt: skip
SPECIALS = ("<pad>", "</s>", "<unk>")
CODES = (*LANGUAGE_CODES, ">>xx<<", ">>nld<<", ">> deu <<", ">><<", ">>deu<<<")


def generated_texts(n: int, seed: int = 0) -> list[str]:
    """`n` texts from both synthetic languages with ODD characters, literal special tokens
    and language codes inserted, words joined by one or more spaces or tabs; every fifth
    starts with a code, every fifth has spaces around it, every fifth starts with a special
    token and a code (MarianTokenizer splits a code after a special token too)."""
    rng = random.Random(seed)
    sentences = synthetic_corpus("source", 600, seed=11) + synthetic_corpus("target", 600, seed=11)
    texts = []
    for i in range(n):
        words = rng.choice(sentences).split(" ")
        for pool, rate in ((ODD, 0.6), (SPECIALS, 0.2), (CODES, 0.15)):
            while rng.random() < rate:
                words.insert(rng.randrange(len(words) + 1), rng.choice(pool))
        text = "".join(w + rng.choice((" ", " ", " ", "  ", " \t")) for w in words)[:-1]
        if i % 5 == 0:
            text = rng.choice(CODES) + rng.choice(("", " ", "  ")) + text
        elif i % 5 == 1:
            text = rng.choice(("  ", " ", "\t")) + text + rng.choice(("  ", " ", "\n"))
        elif i % 5 == 2:
            text = rng.choice(SPECIALS) + rng.choice(CODES) + " " + text
        texts.append(text)
    return texts


@dataclass
class Layout:
    """A built checkpoint, MarianTokenizer on it, and its ids of the generated texts."""

    name: str
    path: Path
    marian: Any  # transformers.MarianTokenizer
    model: Any  # transformers.MarianMTModel
    pad_id: int
    texts: list[str]
    source_ids: list[list[int]]  # MarianTokenizer(text).input_ids
    target_ids: list[list[int]]  # MarianTokenizer(text_target=text).input_ids


_built: dict[str, Path] = {}


def layout_dir(name: str, factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of LAYOUTS[name], built once per test session."""
    if name not in _built:
        _built[name] = build_marian_dir(factory.mktemp(name), **LAYOUTS[name])
    return _built[name]


def load_marian(path: Path) -> tuple[Any, Any]:
    from transformers import MarianMTModel, MarianTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        return MarianTokenizer.from_pretrained(path), MarianMTModel.from_pretrained(path).eval()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Layout:
    path = layout_dir(request.param, tmp_path_factory)
    marian, model = load_marian(path)
    texts = generated_texts(N_TEXTS)
    source_ids = [marian(t).input_ids for t in texts]
    target_ids = [marian(text_target=t).input_ids for t in texts]
    return Layout(
        request.param, path, marian, model, marian.pad_token_id, texts, source_ids, target_ids
    )


def test_generated_texts_cover_the_cases(layout: Layout) -> None:
    texts, ids = layout.texts, layout.source_ids
    assert len(texts) >= 2000
    counts = {
        "leading code": sum(t.startswith(CODES) for t in texts),
        "special token": sum(any(s in t for s in SPECIALS) for t in texts),
        "emoji": sum("😀" in t or "🙂" in t for t in texts),
        "double space": sum("  " in t for t in texts),
        "leading/trailing space": sum(t != t.strip() for t in texts),
        "digits": sum(any(c.isdigit() for c in t) for t in texts),
        "accents": sum(any(c in t for c in "éñüçã") for t in texts),
        "<unk> in Marian's ids": sum(1 in i for i in ids),
        "a known code's id": sum(i[0] == layout.marian.encoder[">>deu<<"] for i in ids),
    }
    assert min(counts.values()) >= 100, counts


@pytest.mark.parametrize("renumber", [False, True], ids=["marian-ids", "edgeseq-ids"])
def test_ids_equal_marian_tokenizer(layout: Layout, renumber: bool) -> None:
    source, target = marian_tokenizers(layout.path, renumber=renumber)
    for side, tokenizer, marian_ids in (
        ("source", source, layout.source_ids),
        ("target", target, layout.target_ids),
    ):
        got = [encoding.ids for encoding in tokenizer.encode_batch(layout.texts)]
        want = [to_edgeseq_ids(i, layout.pad_id).tolist() if renumber else i for i in marian_ids]
        misses = [(t, w, g) for t, w, g in zip(layout.texts, want, got, strict=True) if w != g]
        assert not misses, f"{side}: {len(misses)}/{len(want)} differ, e.g. {misses[:2]}"


def test_decode_equals_marian_tokenizer(layout: Layout) -> None:
    import torch

    batch = layout.marian(
        layout.texts[:32], return_tensors="pt", padding=True, truncation=True, max_length=48
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only cost time (seconds, when busy)
    try:
        with torch.no_grad():
            generated = layout.model.generate(**batch, num_beams=3, max_new_tokens=24).tolist()
    finally:
        torch.set_num_threads(threads)
    rng = random.Random(1)
    vocab = layout.pad_id + 1
    random_ids = [[rng.randrange(vocab) for _ in range(rng.randint(0, 16))] for _ in range(1000)]
    for renumber in (False, True):
        _, target = marian_tokenizers(layout.path, renumber=renumber)
        for ids in generated + random_ids:
            ours = to_edgeseq_ids(ids, layout.pad_id).tolist() if renumber else ids
            want = layout.marian.decode(ids, skip_special_tokens=True)
            assert target.decode(ours, skip_special_tokens=True) == want, (ids, renumber)


def test_language_codes_as_marian_tokenizer_splits_them(layout: Layout) -> None:
    source, _ = marian_tokenizers(layout.path, renumber=False)
    code_id, unk_id = layout.marian.encoder[">>deu<<"], 1
    texts = {
        ">>deu<< the fox": code_id,  # a known code: its vocab.json id
        ">>deu<<the fox": code_id,
        ">>zho_Hans<<": layout.marian.encoder[">>zho_Hans<<"],
        ">>xx<< the fox": unk_id,  # a code vocab.json lacks: <unk>
        ">> deu << the fox": unk_id,  # still one code (up to the first "<<")
        " >>deu<< the fox": None,  # not at the start: SentencePiece's pieces
        "the >>deu<< fox": None,
        ">>deu the fox": None,  # no "<<": no code
    }
    for text, first in texts.items():
        ids = source.encode(text).ids
        assert ids == layout.marian(text).input_ids, text
        assert (ids[0] == first) if first is not None else (code_id not in ids), text
    after_special = source.encode("<pad>>>deu<< the fox").ids
    assert after_special[:2] == [layout.pad_id, code_id]
    assert after_special == layout.marian("<pad>>>deu<< the fox").input_ids


def test_literal_bos_is_a_special_token_in_edgeseq_ids(layout: Layout) -> None:
    text = "the <s> fox"
    marian_ids = layout.marian(text).input_ids
    plain, _ = marian_tokenizers(layout.path, renumber=False)
    assert plain.encode(text).ids == marian_ids  # Marian spells `<s>` out as pieces
    renumbered, _ = marian_tokenizers(layout.path)
    left, right = renumbered.encode("the").ids[:-1], renumbered.encode(" fox").ids
    assert renumbered.encode(text).ids == [*left, 1, *right]
    assert renumbered.encode(text).ids != to_edgeseq_ids(marian_ids, layout.pad_id).tolist()


def test_vocabulary_layout_and_renumbering(layout: Layout) -> None:
    plain, _ = marian_tokenizers(layout.path, renumber=False)
    renumbered, _ = marian_tokenizers(layout.path)
    pad = layout.pad_id
    assert [plain.token_to_id(t) for t in ("</s>", "<unk>", "<pad>")] == [0, 1, pad]
    assert [renumbered.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]
    assert renumbered.get_vocab_size() == plain.get_vocab_size() + 1 == pad + 2
    for token, marian_id in layout.marian.encoder.items():
        edgeseq_id = int(to_edgeseq_ids(marian_id, pad))
        assert renumbered.id_to_token(edgeseq_id) in (token, HIDDEN + token)
        assert plain.id_to_token(marian_id) == renumbered.id_to_token(edgeseq_id)


def test_one_object_when_both_sides_share_vocabulary_and_model(layout: Layout) -> None:
    source, target = marian_tokenizers(layout.path)
    assert (source is target) == (layout.name == "shared")


def test_runtime_tokenizer_accepts_the_renumbered_tokenizers(
    layout: Layout, tmp_path: Path
) -> None:
    source_hf, target_hf = marian_tokenizers(layout.path)
    source = Tokenizer(source_hf, kind="word")  # no kind fits a Unigram yet (see the report)
    target = source if target_hf is source_hf else Tokenizer(target_hf, kind="word")
    pair = TokenizerPair(source, target)
    texts, pad = layout.texts[:300], layout.pad_id
    want = [to_edgeseq_ids(i, pad).tolist() for i in layout.source_ids[:300]]
    assert [[*source.encode(t), source.eos_id] for t in texts] == want
    pair.save(tmp_path)
    loaded = TokenizerPair.load(tmp_path)
    assert loaded.shared == pair.shared
    assert [[*loaded.source.encode(t), 2] for t in texts] == want
    # The runtime decodes up to the first `</s>`, where generation stops.
    for ids in (i[: i.index(0) + 1] for i in layout.target_ids[:300]):
        want = layout.marian.decode(ids, skip_special_tokens=True)
        assert loaded.target.decode(to_edgeseq_ids(ids, pad)) == want


def test_characters_only_the_other_side_knows(tmp_path_factory: pytest.TempPathFactory) -> None:
    """opus-mt-en-de's layout: a character the source model does not know is `<unk>` to
    SentencePiece, then MarianTokenizer finds it in the shared vocab.json (a target piece);
    a run of two such characters is one `<unk>`."""
    path = layout_dir("en-de", tmp_path_factory)
    marian, _ = load_marian(path)
    known = read_spm(path / "source.spm").characters
    char = next(t for t in marian.encoder if len(t) == 1 and t.isalpha() and t not in known)
    source, _ = marian_tokenizers(path, renumber=False)
    for text, has_char_id in ((f"the{char}fox", True), (f"the {char}{char} fox", False)):
        ids = source.encode(text).ids
        assert ids == marian(text).input_ids, text
        assert (marian.encoder[char] in ids) == has_char_id, text


def test_id_mapping() -> None:
    pad = 9
    marian = np.arange(10)
    edgeseq = to_edgeseq_ids(marian, pad)
    assert edgeseq.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 0]
    assert to_marian_ids(edgeseq, pad).tolist() == marian.tolist()
    # Embedding rows in edgeseq order: <s> takes pad's row.
    assert to_marian_ids(np.arange(11), pad).tolist() == [9, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert to_edgeseq_ids([[9, 0], [3, 9]], pad).tolist() == [[0, 2], [5, 0]]
    assert to_edgeseq_ids([], pad).shape == (0,)
    with pytest.raises(TokenizerError, match=r"Marian ids must lie in 0\.\.9"):
        to_edgeseq_ids([3, 10], pad)
    with pytest.raises(TokenizerError, match=r"edgeseq ids must lie in 0\.\.10"):
        to_marian_ids([-1], pad)


# -- errors ----------------------------------------------------------------------------------
def tokenizer_files(name: str, factory: pytest.TempPathFactory, into: Path) -> Path:
    """A copy of the tokenizer files of layout `name` in `into` (to damage)."""
    source = layout_dir(name, factory)
    for file in source.iterdir():
        if file.suffix in (".spm", ".json") and file.name != "config.json":
            shutil.copy(file, into / file.name)
    return into


@pytest.mark.parametrize(
    ("layout_name", "missing"),
    [
        ("shared", "source.spm"),
        ("shared", "target.spm"),
        ("shared", "vocab.json"),
        ("separate", "target_vocab.json"),
    ],
)
def test_missing_file_is_named(
    layout_name: str, missing: str, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    path = tokenizer_files(layout_name, tmp_path_factory, tmp_path)
    (path / missing).unlink()
    with pytest.raises(TokenizerError, match=f"file {missing} is missing"):
        marian_tokenizers(path)


def test_vocabulary_not_in_marian_layout(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    path = tokenizer_files("shared", tmp_path_factory, tmp_path)
    vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    last = max(vocab.values())
    swapped = next(t for t, i in vocab.items() if i == last - 1)
    vocab["<pad>"], vocab[swapped] = last - 1, last
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(TokenizerError, match=f"'<pad>' is at {last - 1}, not {last}"):
        marian_tokenizers(path)
    (path / "vocab.json").write_text('["</s>", "<unk>"]', encoding="utf-8")
    with pytest.raises(TokenizerError, match="is not a Marian vocabulary"):
        marian_tokenizers(path)
    (path / "vocab.json").write_text("{", encoding="utf-8")
    with pytest.raises(TokenizerError, match="cannot read"):
        marian_tokenizers(path)


def test_added_tokens_beyond_the_specials_are_refused(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    path = tokenizer_files("shared", tmp_path_factory, tmp_path)
    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["added_tokens_decoder"]["999"] = {"content": "<eop>", "special": True}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(TokenizerError, match="added tokens besides </s> <unk> <pad>: <eop>"):
        marian_tokenizers(path)


def test_not_a_sentencepiece_model(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    path = tokenizer_files("shared", tmp_path_factory, tmp_path)
    (path / "source.spm").write_bytes(b"\xff\x00 not a model")
    with pytest.raises(TokenizerError, match=r"source\.spm is not a SentencePiece model"):
        marian_tokenizers(path)


def test_unsupported_sentencepiece_options(tmp_path: Path) -> None:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(synthetic_corpus("source", 300)),
        model_writer=model,
        vocab_size=450,
        model_type="bpe",
        byte_fallback=True,
        minloglevel=2,
    )
    (tmp_path / "bpe.spm").write_bytes(model.getvalue())
    with pytest.raises(TokenizerError, match="needs model_type UNIGRAM, no byte_fallback"):
        read_spm(tmp_path / "bpe.spm")


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    (tmp_path / "source.spm").write_bytes(b"")
    with pytest.raises(MissingDependencyError, match=r"pip install 'edgeseq\[hf\]'"):
        read_spm(tmp_path / "source.spm")


def test_importing_the_module_imports_neither_sentencepiece_nor_transformers() -> None:
    code = (
        "import sys, edgeseq.export.sources.marian_tokenizer\n"
        "print(sorted(m for m in ('sentencepiece', 'transformers', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
