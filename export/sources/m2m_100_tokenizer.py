"""The tokenizer of an M2M-100 / NLLB checkpoint as a `tokenizers` object in edgeseq ids,
and its language list, so that the runtime needs neither transformers nor sentencepiece.

    tokenizer, languages, padded = m2m_tokenizer(checkpoint_dir, vocab_size)
    languages["codes"]["fra_Latn"]     # the edgeseq id of the language token
    tokenizer, padded = swapped_tokenizer(checkpoint_dir, vocab_size)   # BART: no languages

The checkpoint's tokenizer.json (NllbTokenizer's `save_pretrained` writes one) is
renumbered by renumber.py: `<s>` 0 and `<pad>` 1 swap places, every other id stays. Its
post-processor is dropped: the runtime adds the source language before the tokens and `</s>`
after them (the non-legacy NLLB layout `[src_lang] tokens </s>`). Language codes are the
tokenizer's extra special tokens (tokenizer_config.json) other than `<s>` `<pad>` `</s>`
`<unk>`; decoding drops them like every special token. mBART-50's tokenizer.json is read the
same way (mbart.py).
M2M100Tokenizer's layout (vocab.json + sentencepiece.bpe.model, no tokenizer.json) is
converted by m2m_100_spm.py; its codes are given without the underscores of their tokens
(`fr` for `__fr__`, the languages object's "token_format").
When the embedding has more rows than the tokenizer has ids (NLLB-200: 256,206 rows, 256,204
ids), the missing ids become special tokens UNUSED.format(id) that no text produces.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeseq.runtime.tokenizer import Tokenizer

from . import SourceError
from .renumber import pad_vocabulary, read_vocabulary

TOKENIZER_JSON, TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"
SPM_MODEL = "sentencepiece.bpe.model"
GENERATION_CONFIG = "generation_config.json"
SPECIALS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
M2M100_TOKEN = "__{}__"  # M2M100Tokenizer's token of a language code (NLLB's: the code)
LANGUAGE_KEYS = ("extra_special_tokens", "additional_special_tokens")
# Texts the export checks against the source tokenizer (scripts, digits, spacing, specials).
CHECK_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "  Leading and  double  spaces, trailing   ",
    "Straße, naïve façade, œuvre — 42 % of 1,000.50 €!",
    "λόγος καλή, привет мир; 東京は晴れ。",
    "tabs\tand\nnew lines",
    "a literal </s> and <unk> inside",
    "",
)


def m2m_tokenizer(path: Path, vocab_size: int) -> tuple[Tokenizer, dict[str, Any], int]:
    """(tokenizer in edgeseq ids, the languages as the bundle records them, how many unused
    ids were added to reach `vocab_size`). Reads tokenizer.json (NLLB) or M2M100Tokenizer's
    vocab.json + sentencepiece.bpe.model (m2m_100_spm.py)."""
    config = read_tokenizer_config(path)
    if config.get("legacy_behaviour"):
        raise SourceError(
            f"{path / TOKENIZER_CONFIG}: legacy_behaviour is true (source language after </s>);"
            " edgeseq places it first (the non-legacy layout): set it to false"
        )
    if not (path / TOKENIZER_JSON).is_file() and (path / "vocab.json").is_file():
        from .m2m_100_spm import m2m100_tokenizer

        tokenizer, codes = m2m100_tokenizer(path, config)
        padded = pad_vocabulary(tokenizer, vocab_size, path / "vocab.json")
        found = _languages(path, config, codes, "en") | {"token_format": M2M100_TOKEN}
        return tokenizer, found, padded
    tokenizer, padded = swapped_tokenizer(path, vocab_size)
    return tokenizer, languages(path, config, tokenizer), padded


def read_tokenizer_config(path: Path) -> dict[str, Any]:
    """tokenizer_config.json ({} when absent)."""
    return read_json(path / TOKENIZER_CONFIG) if (path / TOKENIZER_CONFIG).is_file() else {}


def swapped_tokenizer(path: Path, vocab_size: int) -> tuple[Tokenizer, int]:
    """(the checkpoint's tokenizer.json in edgeseq ids, padded with UNUSED special tokens to
    `vocab_size` ids; how many were added). SourceError when it has more ids than that."""
    file = _tokenizer_json(path)
    tokenizer = read_vocabulary(file, SPECIALS).tokenizer()
    return tokenizer, pad_vocabulary(tokenizer, vocab_size, file)


def languages(path: Path, config: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    """The language codes (extra special tokens of tokenizer_config.json that the vocabulary
    has) with their edgeseq ids, the default source (src_lang, else eng_Latn) and target
    (tgt_lang, else generation_config.json's forced_bos_token_id) languages."""
    listed: list[Any] = next((config[k] for k in LANGUAGE_KEYS if config.get(k)), [])
    names = [item.get("content") if isinstance(item, dict) else item for item in listed]
    codes = {str(n): tokenizer.hf.token_to_id(str(n)) for n in names if n}
    codes = {code: i for code, i in codes.items() if i is not None and i >= len(SPECIALS)}
    if not codes:
        raise SourceError(
            f"{path / TOKENIZER_CONFIG} lists no language codes (extra_special_tokens) that the "
            "tokenizer has: not an M2M-100 / NLLB tokenizer"
        )
    return _languages(path, config, codes, "eng_Latn")


def _languages(
    path: Path, config: dict[str, Any], codes: dict[str, int], usual_source: str
) -> dict[str, Any]:
    """The bundle's languages object for `codes` (code -> edgeseq id): the default source is
    src_lang (else `usual_source`, else the first code), the target tgt_lang (else the code
    of generation_config.json's forced_bos_token_id, else none)."""
    fallback = usual_source if usual_source in codes else next(iter(codes))
    source = config.get("src_lang") or fallback
    target = config.get("tgt_lang")
    generation = path / GENERATION_CONFIG
    forced = read_json(generation).get("forced_bos_token_id") if generation.is_file() else None
    if target is None and forced is not None:
        target = next((c for c, i in codes.items() if i == _edgeseq_id(forced)), None)
    for role, code in (("src_lang", source), ("tgt_lang", target)):
        if code is not None and code not in codes:
            raise SourceError(f"{path / TOKENIZER_CONFIG}: {role} {code!r} is not a language code")
    return {
        "codes": dict(sorted(codes.items())),
        "default_source": source,
        "default_target": target,
        "source_prefix": True,
    }


def _edgeseq_id(source_id: int) -> int:
    return {0: 1, 1: 0}.get(source_id, source_id)


def _tokenizer_json(path: Path) -> Path:
    """tokenizer.json, written from sentencepiece.bpe.model by transformers when absent."""
    file = path / TOKENIZER_JSON
    if file.is_file():
        return file
    if not (path / SPM_MODEL).is_file():
        raise SourceError(f"{path} has neither {TOKENIZER_JSON} nor {SPM_MODEL}")
    raise SourceError(
        f"{path} has {SPM_MODEL} but no {TOKENIZER_JSON}: write one with transformers "
        "(AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)) and export again"
    )


def read_json(file: Path) -> dict[str, Any]:
    """The JSON object in `file`; SourceError when it cannot be read or is not an object."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SourceError(f"cannot read {file}: {exc}") from None
    if not isinstance(data, dict):
        raise SourceError(f"{file} is not a JSON object")
    return data
