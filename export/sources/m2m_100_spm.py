"""M2M100Tokenizer's layout (the `facebook/m2m100_*` checkpoints: `vocab.json` +
`sentencepiece.bpe.model`, no tokenizer.json) as a `tokenizers` BPE in edgeseq ids, with
M2M-100's language tokens.

    tokenizer, tokens = m2m100_tokenizer(checkpoint_dir)
    tokens["fr"]          # the edgeseq id of `__fr__`
    tokenizer.encode("Hello").ids    # M2M100Tokenizer("Hello").input_ids without `__en__`
                                     # and `</s>`, renumbered

What M2M100Tokenizer does (transformers' tokenization_m2m_100.py): SentencePiece BPE pieces of
each text between special tokens, each piece's id looked up in vocab.json (fairseq's
dictionary: `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, then pieces in the dictionary's order,
not SentencePiece's); the language tokens `__xx__` of FAIRSEQ_LANGUAGE_CODES[language_codes]
(tokenizer_config.json, "m2m100" by default) numbered len(vocab.json) + their index; the
layout `[__src__] tokens </s>`. Ids beyond those (the `num_madeup_words`) are rows of the
embedding no text produces: the caller pads them (renumber.pad_vocabulary).

The conversion: a BPE over the SentencePiece pieces whose merges are ordered by the merged
piece's SentencePiece id (as transformers' SentencePieceExtractor orders them), unknown
characters fused into one `<unk>`; SentencePiece's normaliser (its precompiled character
map, whitespace collapsed and stripped); a Metaspace pre-tokenizer that prefixes every text
between special tokens with `▁`; `<s>` `<pad>` `</s>` `<unk>` and the language tokens as
special added tokens; no post-processor (the runtime adds the language and `</s>`); decoding
joins the pieces and strips the result, as M2M100Tokenizer's decode does. Ids are
edgeseq's: `<s>` and `<pad>` swap places (0 <-> 1), every other id is M2M-100's.
Refused: a SentencePiece piece that vocab.json lacks (M2M100Tokenizer gives it `<unk>`'s id,
which one BPE cannot express).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from edgeseq.runtime.errors import TokenizerError
from edgeseq.runtime.tokenizer import Tokenizer

from . import SourceError
from .marian_tokenizer import SPIECE, read_spm, read_vocab, spm_decoder

VOCAB, SPM_MODEL = "vocab.json", "sentencepiece.bpe.model"
M2M_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # M2M-100 ids 0..3


def m2m100_tokenizer(path: Path, config: dict[str, Any]) -> tuple[Tokenizer, dict[str, int]]:
    """(the tokenizer of the checkpoint directory `path` in edgeseq ids, its language codes
    -> edgeseq ids of their tokens); `config` is tokenizer_config.json."""
    try:
        vocab = read_vocab(path / VOCAB)
        spm = read_spm(path / SPM_MODEL, model_type="BPE")
    except TokenizerError as exc:
        raise SourceError(str(exc)) from None
    problems = [
        f"{token!r} is at {vocab.get(token)}, not {i}"
        for i, token in enumerate(M2M_SPECIALS)
        if vocab.get(token) != i
    ]
    if sorted(vocab.values()) != list(range(len(vocab))):
        problems.append("its ids are not 0..n-1, each once")
    missing = [piece for piece in spm.scores if piece not in vocab]
    if missing:
        problems.append(f"{len(missing)} SentencePiece pieces are missing (e.g. {missing[0]!r})")
    if problems:
        raise SourceError(
            f"{path / VOCAB} is not M2M100Tokenizer's vocabulary for {SPM_MODEL} ("
            + "; ".join(problems)
            + "): export with the checkpoint's own tokenizer files"
        )
    codes = language_codes(config, path)
    edgeseq = {token: _edgeseq_id(i) for token, i in vocab.items()}
    tokens = {code: len(vocab) + i for i, code in enumerate(codes)}
    edgeseq |= {_language_token(code): i for code, i in tokens.items()}
    hf = HFTokenizer(
        models.BPE(edgeseq, _merges(list(spm.scores)), unk_token="<unk>", fuse_unk=True)
    )
    steps = [normalizers.Precompiled(spm.charsmap)] if spm.charsmap else []
    hf.normalizer = normalizers.Sequence(
        [*steps, normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    hf.pre_tokenizer = pre_tokenizers.Metaspace(SPIECE, prepend_scheme="always", split=True)
    hf.decoder = spm_decoder()
    specials = [*M2M_SPECIALS, *map(_language_token, codes)]  # edgeseq's names too
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for token, i in edgeseq.items():
        if hf.token_to_id(token) != i:
            raise SourceError(f"{path / VOCAB}: cannot give {token!r} the id {i}")
    return Tokenizer(hf, "bpe"), tokens


def language_codes(config: dict[str, Any], path: Path) -> list[str]:
    """M2M100Tokenizer's language codes for tokenizer_config.json's `language_codes`, in
    id order (from transformers, which the export needs for this layout)."""
    try:
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES
    except ImportError as exc:
        raise SourceError(
            f"{path} has M2M100Tokenizer's layout, whose language codes come from transformers "
            f"({exc}): pip install 'edgeseq[hf]'"
        ) from None
    name = config.get("language_codes", "m2m100")
    if name not in FAIRSEQ_LANGUAGE_CODES:
        known = ", ".join(FAIRSEQ_LANGUAGE_CODES)
        raise SourceError(
            f"{path}/tokenizer_config.json: language_codes {name!r} is not one of {known}; "
            "set it to the list the checkpoint was trained with"
        )
    return list(FAIRSEQ_LANGUAGE_CODES[name])


def _merges(pieces: list[str]) -> list[tuple[str, str]]:
    """BPE merges of SentencePiece BPE `pieces` (in SentencePiece id order): every split of a
    piece into two pieces, ranked by the merged piece's id, then the halves' lengths."""
    rank = {piece: i for i, piece in enumerate(pieces)}
    merges = []
    for piece in pieces:
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))]
        found = sorted(
            ((a, b) for a, b in splits if a in rank and b in rank),
            key=lambda m: (rank[m[0]], rank[m[1]]),
        )
        merges += [(rank[piece], a, b) for a, b in found]
    merges.sort(key=lambda m: (m[0], len(m[1]), len(m[2])))
    return [(a, b) for _, a, b in merges]


def _language_token(code: str) -> str:
    return f"__{code}__"


def _edgeseq_id(m2m_id: int) -> int:
    return {0: 1, 1: 0}.get(m2m_id, m2m_id)
