"""MarianMT's tokenizers (SentencePiece models + vocab.json) as `tokenizers` objects that give
`transformers.MarianTokenizer`'s ids without sentencepiece or transformers at run time.

    source, target = marian_tokenizers(checkpoint_dir)          # edgeseq ids (the default)
    source.encode("Hallo Welt").ids     # MarianTokenizer("Hallo Welt").input_ids, renumbered
    target.decode(ids, skip_special_tokens=True)   # MarianTokenizer.decode(..., True)
    source, target = marian_tokenizers(checkpoint_dir, renumber=False)   # Marian's own ids
    to_edgeseq_ids(marian_ids, pad_id); to_marian_ids(edgeseq_ids, pad_id)

Marian's ids are `vocab.json[piece]` of the SentencePiece pieces (not SentencePiece's ids):
`</s>` 0, `<unk>` 1, ..., `<pad>` last (the decoder start), no `<s>`. edgeseq needs `<pad>`
`<s>` `</s>` `<unk>` at 0..3, so `renumber=True` maps Marian id m to: pad -> 0, a new `<s>`
-> 1 (the model importer gives it pad's embedding row), 0 -> 2, 1 -> 3, 2 <= m < pad ->
m + 2. The vocabulary grows by one.

The conversion: a Unigram model over vocab.json in id order with the SentencePiece scores;
SentencePiece's normaliser (its precompiled character map, whitespace collapsed, the dummy
`▁` prefix); a Metaspace pre-tokenizer; `<pad>` `</s>` `<unk>` as special added tokens; a
post-processor appending `</s>`. Besides, what MarianTokenizer does around SentencePiece:

- A leading language code `>>xx<<` of each text between special tokens is split off and
  looked up in vocab.json (`<unk>` when absent).
- vocab.json entries SentencePiece cannot produce (language codes, the other side's pieces of
  a shared vocabulary) keep their ids but are spelled HIDDEN + entry, so that the Unigram
  never finds them in text; the normaliser writes HIDDEN before a leading known code and the
  decoder drops it.
- A run of characters SentencePiece does not know is one `<unk>` piece whose text Marian
  then looks up in vocab.json: with a shared vocabulary and two SentencePiece models
  (opus-mt-en-de's layout) a single such character can be a piece of the other side. Those
  characters are Unigram pieces at `<unk>`'s score, and longer runs become one `<unk>`.
  A run of two or more such characters that is itself a vocab.json entry is the one case
  this gets wrong (it gives `<unk>`).

Needs the `hf` extra (sentencepiece, and protobuf, which onnxruntime already brings) to read
the `.spm` files; imports it only when called.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from edgeseq.runtime.errors import MissingDependencyError, TokenizerError

HF_EXTRA = "pip install 'edgeseq[hf]'"
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
EOS, UNK, PAD, BOS = "</s>", "<unk>", "<pad>", "<s>"
MARIAN_SPECIALS = (EOS, UNK, PAD)  # Marian ids 0, 1, last
EDGESEQ_SPECIALS = (PAD, BOS, EOS, UNK)  # edgeseq ids 0..3
SPIECE = "▁"
# Private-use characters the normaliser writes (SentencePiece models never contain them).
HIDDEN = "\ue000"  # prefix of vocabulary entries SentencePiece cannot produce
ESCAPED = "\ue001"  # a HIDDEN in the input, and a run of unknown characters, become this
UNREACHABLE_SCORE = -1e4  # below any SentencePiece score: the Unigram never prefers the piece
UNKNOWN_PENALTY = 10.0  # SentencePiece's <unk> score: the lowest piece score minus this
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")


@dataclass(frozen=True)
class SpmModel:
    """What the conversion needs from a SentencePiece model file."""

    scores: dict[str, float]  # normal pieces -> log probability
    charsmap: bytes  # the normaliser's precompiled character map (empty: identity)

    @property
    def characters(self) -> set[str]:
        """The characters SentencePiece knows (those of its pieces)."""
        return {ch for piece in self.scores for ch in piece}


def marian_tokenizers(
    checkpoint_dir: str | Path, renumber: bool = True
) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) `tokenizers` objects of the Marian checkpoint in `checkpoint_dir`; one
    object twice when both sides share the vocabulary and the SentencePiece model. Ids are
    edgeseq's (`renumber`, see the module docstring) or Marian's."""
    directory = Path(checkpoint_dir)
    config_path = directory / TOKENIZER_CONFIG
    config = _read_json(config_path) if config_path.is_file() else {}
    source_vocab = read_vocab(directory / VOCAB)
    if not isinstance(config, dict):
        raise TokenizerError(f"{config_path} is not a JSON object")
    added = {entry.get("content") for entry in config.get("added_tokens_decoder", {}).values()}
    if added - set(MARIAN_SPECIALS):
        extra = ", ".join(sorted(map(str, added - set(MARIAN_SPECIALS))))
        raise TokenizerError(f"{config_path}: added tokens besides </s> <unk> <pad>: {extra}")
    separate = config.get("separate_vocabs", False)
    target_vocab = read_vocab(directory / TARGET_VOCAB) if separate else source_vocab
    source_spm, target_spm = _require(directory / SOURCE_SPM), _require(directory / TARGET_SPM)
    source = marian_tokenizer(source_spm, source_vocab, renumber)
    if target_vocab is source_vocab and target_spm.read_bytes() == source_spm.read_bytes():
        return source, source
    return source, marian_tokenizer(target_spm, target_vocab, renumber)


def marian_tokenizer(
    spm_path: str | Path, vocab: dict[str, int], renumber: bool = True
) -> Tokenizer:
    """One side's tokenizer: the SentencePiece model `spm_path` with Marian's `vocab`."""
    spm = read_spm(spm_path)
    pad_id = check_vocab(vocab)
    entries = sorted(vocab, key=vocab.__getitem__)
    unknown_score = min(spm.scores.values()) - UNKNOWN_PENALTY
    pieces = [_unigram_piece(e, spm.scores, unknown_score) for e in entries]
    specials = EDGESEQ_SPECIALS if renumber else MARIAN_SPECIALS
    if renumber:  # <pad> <s> </s> <unk>, then Marian ids 2 .. pad-1
        pieces = [pieces[pad_id], (BOS, UNREACHABLE_SCORE), pieces[0], pieces[1], *pieces[2:pad_id]]
    ids = {piece: i for i, (piece, _) in enumerate(pieces)}
    codes = [e for e in entries if _is_language_code(e) and HIDDEN + e in ids]
    if any(_is_language_code(e) and e in spm.scores for e in entries):
        raise TokenizerError(f"{spm_path}: a language code >>xx<< that is a piece: unsupported")
    # vocab.json characters SentencePiece does not know (see the module docstring)
    unknown_pieces = any(score == unknown_score for _, score in pieces)
    hf = Tokenizer(models.Unigram(pieces, unk_id=ids[UNK], byte_fallback=False))
    hf.normalizer = _normalizer(spm, codes, collapse_unknown=unknown_pieces)
    hf.pre_tokenizer = pre_tokenizers.Metaspace(SPIECE, prepend_scheme="never", split=True)
    hf.decoder = spm_decoder()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    hf.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A $B {EOS}", special_tokens=[(EOS, ids[EOS])]
    )
    return hf


def to_edgeseq_ids(marian_ids: Any, pad_id: int) -> np.ndarray:
    """Marian ids (any shape) in edgeseq numbering: pad -> 0, 0 -> 2, 1 -> 3, m -> m + 2."""
    ids = np.asarray(marian_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > pad_id):
        raise TokenizerError(f"Marian ids must lie in 0..{pad_id} (the pad id)")
    return np.where(ids == pad_id, 0, ids + 2)


def to_marian_ids(edgeseq_ids: Any, pad_id: int) -> np.ndarray:
    """edgeseq ids (any shape) in Marian numbering: 0 and 1 (`<s>`, where Marian starts from
    pad) -> pad, 2 -> 0, 3 -> 1, e -> e - 2. The inverse of `to_edgeseq_ids` except at 1;
    `to_marian_ids(np.arange(pad_id + 2), pad_id)` is the row order of an embedding table."""
    ids = np.asarray(edgeseq_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > pad_id + 1):
        raise TokenizerError(f"edgeseq ids must lie in 0..{pad_id + 1} (Marian's pad id + 1)")
    return np.where(ids <= 1, pad_id, ids - 2)


def read_vocab(path: Path) -> dict[str, int]:
    """Marian's vocab.json (token -> id)."""
    vocab = _read_json(_require(path))
    if not isinstance(vocab, dict) or not all(type(i) is int for i in vocab.values()):
        raise TokenizerError(f"{path} is not a Marian vocabulary (a JSON object token -> id)")
    return vocab


def check_vocab(vocab: dict[str, int]) -> int:
    """Check Marian's layout (`</s>` 0, `<unk>` 1, `<pad>` last, ids 0..n-1); the pad id."""
    problems = []
    if sorted(vocab.values()) != list(range(len(vocab))):
        problems.append("ids are not 0..n-1, each once")
    for token, want in ((EOS, 0), (UNK, 1), (PAD, len(vocab) - 1)):
        if vocab.get(token) != want:
            problems.append(f"{token!r} is at {vocab.get(token)}, not {want}")
    if BOS in vocab:
        problems.append(f"it has {BOS!r}, which Marian vocabularies do not")
    if problems:
        raise TokenizerError("not a Marian vocabulary: " + "; ".join(problems))
    return len(vocab) - 1


def read_spm(path: str | Path, model_type: str = "UNIGRAM") -> SpmModel:
    """The pieces, scores and normaliser of a SentencePiece model of `model_type` ("UNIGRAM"
    or "BPE"); refuses the options the conversions do not reproduce (every problem in one
    error)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as exc:
        raise MissingDependencyError(
            f"reading SentencePiece models needs sentencepiece and protobuf ({exc}); "
            f"install them with: {HF_EXTRA}"
        ) from None
    path = _require(Path(path))
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # protobuf's DecodeError
        raise TokenizerError(f"{path} is not a SentencePiece model: {exc}") from None
    trainer, norm, piece_type = proto.trainer_spec, proto.normalizer_spec, proto.SentencePiece
    ours = {HIDDEN, ESCAPED}
    required = {
        f"model_type {model_type}": trainer.model_type == getattr(trainer, model_type),
        "no byte_fallback": not trainer.byte_fallback,
        "split_by_whitespace": trainer.split_by_whitespace,
        "no split_digits": not trainer.split_digits,
        "no treat_whitespace_as_suffix": not trainer.treat_whitespace_as_suffix,
        "add_dummy_prefix": norm.add_dummy_prefix,
        "remove_extra_whitespaces": norm.remove_extra_whitespaces,
        "escape_whitespaces": norm.escape_whitespaces,
        "no denormalizer": not proto.denormalizer_spec.precompiled_charsmap,
        "no user-defined or byte pieces": all(
            p.type not in (piece_type.USER_DEFINED, piece_type.BYTE) for p in proto.pieces
        ),
        "normal pieces": any(p.type == piece_type.NORMAL for p in proto.pieces),
        "no piece with the private-use characters U+E000 or U+E001": not any(
            ch in ours for p in proto.pieces for ch in p.piece
        ),
    }
    missing = [name for name, ok in required.items() if not ok]
    if missing:
        raise TokenizerError(f"{path}: unsupported SentencePiece model, needs {', '.join(missing)}")
    scores = {p.piece: p.score for p in proto.pieces if p.type == piece_type.NORMAL}
    return SpmModel(scores, bytes(norm.precompiled_charsmap))


def _normalizer(
    spm: SpmModel, codes: Sequence[str], collapse_unknown: bool
) -> normalizers.Normalizer:
    """MarianTokenizer's handling of one text between special tokens as normalisation steps.
    The space prepended first is SentencePiece's dummy `▁` prefix. A leading known language
    code becomes HIDDEN + code + space (in two steps: a replacement cannot say which code
    matched), an unknown one HIDDEN + space (a lone HIDDEN is `<unk>`). Then SentencePiece's
    normaliser, and runs of characters it does not know become one unknown character."""
    precompiled = normalizers.Precompiled(spm.charsmap) if spm.charsmap else None
    if precompiled is not None:
        if precompiled.normalize_str(HIDDEN + ESCAPED) != HIDDEN + ESCAPED:
            raise TokenizerError("the SentencePiece normaliser changes private-use characters")
        codes = [c for c in codes if precompiled.normalize_str(c) == c]  # real codes: ASCII
    steps = [normalizers.Replace(HIDDEN, ESCAPED), normalizers.Prepend(" ")]
    if codes:
        names = "|".join(_regex_escape(c[2:-2]) for c in codes)
        steps.append(normalizers.Replace(Regex(rf"\A (?=>>(?:{names})<<)"), HIDDEN))
        after = "|".join(rf"\A{HIDDEN}>>{_regex_escape(c[2:-2])}" for c in codes)
        steps.append(normalizers.Replace(Regex(f"(?<={after})<<"), "<< "))
    steps.append(normalizers.Replace(Regex(r"\A >>[\s\S]*?<<"), f"{HIDDEN} "))
    if precompiled is not None:
        steps.append(precompiled)
    steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(r" +\z"), "")]
    if collapse_unknown:
        known = spm.characters | {" ", HIDDEN} | {ch for c in codes for ch in c}
        steps.append(normalizers.Replace(Regex(f"[^{_character_class(known)}]{{2,}}"), ESCAPED))
    return normalizers.Sequence(steps)


def spm_decoder() -> decoders.Decoder:
    """MarianTokenizer's decoding: pieces joined, `▁` -> space, the result stripped."""
    return decoders.Sequence(
        [
            decoders.Replace(HIDDEN, ""),
            decoders.Metaspace(SPIECE, prepend_scheme="always"),
            decoders.Fuse(),
            decoders.Replace(Regex(r"\A\s+|\s+\z"), ""),
        ]
    )


def _unigram_piece(entry: str, scores: dict[str, float], unknown_score: float) -> tuple[str, float]:
    """The Unigram's (piece, score) for a vocab.json entry: a SentencePiece piece with its
    score; a special token, never preferred; a character SentencePiece does not know, at
    `<unk>`'s score (SentencePiece calls it unknown, then MarianTokenizer finds its text in
    vocab.json); anything else (language codes, the other side's pieces) HIDDEN-prefixed."""
    if entry in scores:
        return entry, scores[entry]
    if entry in MARIAN_SPECIALS:
        return entry, UNREACHABLE_SCORE
    if len(entry) == 1 and entry != SPIECE and not entry.isspace():
        return entry, unknown_score
    return HIDDEN + entry, UNREACHABLE_SCORE


def _is_language_code(token: str) -> bool:
    """Would MarianTokenizer split `token`, at the start of a text, as one language code? (And
    can it be one pre-token: no whitespace.)"""
    return (
        token.startswith(">>")
        and token.find("<<") == len(token) - 2
        and not any(ch.isspace() or ch == SPIECE for ch in token)
    )


def _character_class(chars: set[str]) -> str:
    """The inside of a regex character class matching `chars`, as code point ranges."""
    points = sorted(ord(ch) for ch in chars)
    ranges: list[list[int]] = []
    for point in points:
        if ranges and point == ranges[-1][1] + 1:
            ranges[-1][1] = point
        else:
            ranges.append([point, point])
    return "".join(rf"\x{{{a:X}}}-\x{{{b:X}}}" for a, b in ranges)


def _regex_escape(text: str) -> str:
    """`text` as a literal in a `tokenizers` (Oniguruma) regex."""
    return "".join(f"\\{ch}" if ch in _REGEX_META else ch for ch in text)


def _require(path: Path) -> Path:
    if not path.is_file():
        raise TokenizerError(
            f"Marian checkpoint file {path.name} is missing: {path} does not exist"
        )
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read {path}: {exc}") from None


__all__ = [
    "HF_EXTRA",
    "check_vocab",
    "marian_tokenizer",
    "marian_tokenizers",
    "read_spm",
    "read_vocab",
    "to_edgeseq_ids",
    "to_marian_ids",
]
