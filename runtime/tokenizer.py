"""Torch-free tokenizers over the `tokenizers` library.

Three kinds that edgeseq trains, all with the special tokens `<pad>` `<s>` `</s>` `<unk>` at
ids 0..3 (and `unigram`, a SentencePiece model converted when a MarianMT checkpoint is
imported: export/sources/marian_tokenizer.py):

- ``char``: every character is a token (G2P graphemes, synthetic tasks);
- ``word``: whitespace-separated symbols are tokens (phoneme sequences like ``HH AH0 L OW1``);
- ``bpe``: byte-pair encoding trained on the corpus (sentence tasks).

    tok = Tokenizer.train_char(["hello", "world"])
    ids = tok.encode("hello")            # [7, 6, 8, 8, 9], no specials
    tok.decode(ids) == "hello"           # specials are dropped
    batch = tok.encode_batch(["hi", "hello"], add_bos=False, add_eos=True)  # padded int64 array

A model has a source and a target tokenizer (`TokenizerPair`); they may be one object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from .constants import BOS, EOS, PAD, SPECIAL_TOKENS, TOKENIZER_FILE, UNK
from .errors import TokenizerError
from .padding import right_pad

KINDS = ("char", "word", "bpe")  # what edgeseq trains
IMPORTED_KINDS = ("unigram",)  # converted at import: SentencePiece Unigram (MarianMT)
# Normalisation steps a task may train with; they are stored in tokenizer.json's
# "normalizer" (a Sequence in this order) and every runtime applies them before tokenizing.
NORMALIZERS = {
    "nfc": normalizers.NFC,
    "strip": normalizers.Strip,
    "lowercase": normalizers.Lowercase,
}
TARGET_TOKENIZER_FILE = "tokenizer.target.json"  # present only when target vocabulary differs
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # for transformers' PreTrainedTokenizerFast
SPECIAL_ROLES = ("pad_token", "bos_token", "eos_token", "unk_token")  # order of SPECIAL_TOKENS


class Tokenizer:
    """One vocabulary: text <-> token ids. Wraps a `tokenizers.Tokenizer`."""

    def __init__(self, hf: HFTokenizer, kind: str) -> None:
        if kind not in KINDS + IMPORTED_KINDS:
            known = ", ".join(KINDS + IMPORTED_KINDS)
            raise TokenizerError(f"unknown tokenizer kind {kind!r}; use one of {known}")
        for want_id, token in enumerate(SPECIAL_TOKENS):
            if hf.token_to_id(token) != want_id:
                raise TokenizerError(
                    f"tokenizer must have {token!r} at id {want_id}; retrain it with edgeseq"
                )
        register_special_tokens(hf)
        self.hf = hf
        self.kind = kind
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = range(len(SPECIAL_TOKENS))

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def train_char(cls, texts: Iterable[str], normalize: Sequence[str] = ()) -> Tokenizer:
        """Character vocabulary of every character seen in `texts` after `normalize`
        (names from NORMALIZERS, applied in order), sorted."""
        normalizer = build_normalizer(normalize)
        chars = sorted({c for t in _normalized(texts, normalizer) for c in t})
        hf = HFTokenizer(models.WordLevel(_vocab(chars), unk_token=UNK))
        hf.normalizer = normalizer
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()
        return cls(hf, "char")

    @classmethod
    def train_word(cls, texts: Iterable[str], normalize: Sequence[str] = ()) -> Tokenizer:
        """Vocabulary of whitespace-separated symbols seen in `texts` after `normalize`."""
        normalizer = build_normalizer(normalize)
        symbols = sorted({s for t in _normalized(texts, normalizer) for s in t.split()})
        hf = HFTokenizer(models.WordLevel(_vocab(symbols), unk_token=UNK))
        hf.normalizer = normalizer
        hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return cls(hf, "word")

    @classmethod
    def train_bpe(
        cls, texts: Iterable[str], vocab_size: int = 8000, normalize: Sequence[str] = ()
    ) -> Tokenizer:
        """Byte-pair encoding with `vocab_size` entries learned from `texts` after
        `normalize`."""
        hf = HFTokenizer(models.BPE(unk_token=UNK))
        hf.normalizer = build_normalizer(normalize)
        hf.pre_tokenizer = pre_tokenizers.Metaspace()
        hf.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
        )
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf, "bpe")

    @classmethod
    def train(
        cls, kind: str, texts: Sequence[str], vocab_size: int = 8000, normalize: Sequence[str] = ()
    ) -> Tokenizer:
        """Train a tokenizer of `kind` ("char", "word" or "bpe") on `texts`, normalised by
        the steps `normalize` (names of NORMALIZERS) both now and whenever it encodes."""
        if kind == "char":
            return cls.train_char(texts, normalize)
        if kind == "word":
            return cls.train_word(texts, normalize)
        if kind == "bpe":
            return cls.train_bpe(texts, vocab_size, normalize)
        raise TokenizerError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(KINDS)}")

    # -- persistence ------------------------------------------------------------------------
    def to_str(self) -> str:
        """Serialised `tokenizers` JSON (the kind is implied by its model and decoder)."""
        return self.hf.to_str(pretty=True)

    def save(self, path: str | Path) -> None:
        """Write a `tokenizer.json` loadable by `tokenizers.Tokenizer.from_file`."""
        Path(path).write_text(self.to_str(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a tokenizer file written by `save`."""
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer file {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
            kind = _kind_of(json.loads(text))
            hf = HFTokenizer.from_str(text)
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise TokenizerError(f"cannot read tokenizer {path}: {exc}") from None
        return cls(hf, kind)

    # -- use --------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    def normalize(self, text: str) -> str:
        """`text` as the tokenizer sees it: its normalizer applied (identity without one)."""
        normalizer = self.hf.normalizer
        return normalizer.normalize_str(text) if normalizer is not None else text

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens; unknown symbols become `<unk>`."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(
        self,
        texts: Sequence[str],
        add_bos: bool = False,
        add_eos: bool = False,
        max_len: int | None = None,
    ) -> np.ndarray:
        """Encode and right-pad with `<pad>`: int64 array [batch, longest]."""
        rows = []
        for ids in (e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)):
            ids = ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])
            rows.append(ids[:max_len] if max_len is not None else ids)
        return right_pad(rows, self.pad_id)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, dropping special tokens (`<pad>` `<s>` `<unk>`, an imported model's
        language codes) and everything after `</s>`."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i >= len(SPECIAL_TOKENS):
                kept.append(i)
        return self.hf.decode(kept, skip_special_tokens=True)  # language codes are special

    def id_to_token(self, i: int) -> str:
        """The token string of id `i`."""
        token = self.hf.id_to_token(int(i))
        if token is None:
            raise TokenizerError(f"id {i} is outside the vocabulary of {self.vocab_size}")
        return token


def utf8_text(text: str) -> str:
    """`text` with every unpaired surrogate replaced by U+FFFD (a pair becomes its character)."""
    if text.isascii():
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def build_normalizer(steps: Sequence[str]) -> normalizers.Normalizer | None:
    """A `tokenizers` normalizer applying `steps` (names of NORMALIZERS) in order; None
    for no step."""
    unknown = [step for step in steps if step not in NORMALIZERS]
    if unknown:
        raise TokenizerError(
            f"unknown normalisation {unknown}; use names from {', '.join(NORMALIZERS)}"
        )
    if not steps:
        return None
    return normalizers.Sequence([NORMALIZERS[step]() for step in steps])


def _normalized(texts: Iterable[str], normalizer: normalizers.Normalizer | None) -> Iterable[str]:
    if normalizer is None:
        return texts
    return (normalizer.normalize_str(t) for t in texts)


def register_special_tokens(hf: HFTokenizer) -> None:
    """Mark `<pad>` `<s>` `</s>` `<unk>` (already ids 0..3 of the vocabulary) as special added
    tokens of `hf`, so that `decode(ids, skip_special_tokens=True)` drops them in every
    `tokenizers` binding and transformers recognises them. Idempotent; no id changes."""
    hf.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )


def tokenizer_config(model_max_length: int | None = None) -> dict[str, object]:
    """The content of `tokenizer_config.json`: what `transformers`'
    `PreTrainedTokenizerFast.from_pretrained(directory)` needs besides `tokenizer.json`."""
    config: dict[str, object] = dict(zip(SPECIAL_ROLES, SPECIAL_TOKENS, strict=True))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["clean_up_tokenization_spaces"] = False
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    return config


def write_tokenizer_config(directory: str | Path, model_max_length: int | None = None) -> None:
    """Write `tokenizer_config.json` into `directory` (see `tokenizer_config`)."""
    text = json.dumps(tokenizer_config(model_max_length), indent=2, sort_keys=True) + "\n"
    (Path(directory) / TOKENIZER_CONFIG_FILE).write_text(text, encoding="utf-8")


def _kind_of(data: dict) -> str:
    """Recover the kind from a tokenizer's JSON: BPE, Unigram (imported SentencePiece), or
    WordLevel fused (char) or not (word)."""
    model_type = data.get("model", {}).get("type")
    if model_type == "BPE":
        return "bpe"
    if model_type == "Unigram":
        return "unigram"
    decoder = data.get("decoder") or {}
    return "char" if decoder.get("type") == "Fuse" else "word"


def _vocab(symbols: Sequence[str]) -> dict[str, int]:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for s in symbols:
        if s not in vocab:
            vocab[s] = len(vocab)
    return vocab


@dataclass
class TokenizerPair:
    """The source and target tokenizers of a model (the same object when shared)."""

    source: Tokenizer
    target: Tokenizer

    @property
    def shared(self) -> bool:
        """True when source and target use one vocabulary."""
        return self.source is self.target

    def save(self, directory: str | Path, model_max_length: int | None = None) -> list[str]:
        """Write `tokenizer.json` (and `tokenizer.target.json` when not shared) and
        `tokenizer_config.json`; return the tokenizer files' names, source first."""
        directory = Path(directory)
        self.source.save(directory / TOKENIZER_FILE)
        write_tokenizer_config(directory, model_max_length)
        if self.shared:
            return [TOKENIZER_FILE]
        self.target.save(directory / TARGET_TOKENIZER_FILE)
        return [TOKENIZER_FILE, TARGET_TOKENIZER_FILE]

    @classmethod
    def load(cls, directory: str | Path) -> TokenizerPair:
        """Read the files written by `save`."""
        directory = Path(directory)
        source = Tokenizer.load(directory / TOKENIZER_FILE)
        target_path = directory / TARGET_TOKENIZER_FILE
        target = Tokenizer.load(target_path) if target_path.exists() else source
        return cls(source, target)


__all__ = [
    "BOS",
    "EOS",
    "KINDS",
    "NORMALIZERS",
    "PAD",
    "TARGET_TOKENIZER_FILE",
    "TOKENIZER_CONFIG_FILE",
    "UNK",
    "Tokenizer",
    "TokenizerPair",
    "utf8_text",
]
