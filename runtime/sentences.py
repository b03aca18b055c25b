"""Sentence splitting of long inputs (`GenerationOptions.split_sentences`, `edgeseq generate
--split-sentences`, the server's "split_sentences" option).

    sentences("Hello world. How are you?", "en")    # ["Hello world.", "How are you?"]
    joiner("ja")                                     # "": no space between Japanese sentences
    splitter_language("eng_Latn")                    # "en" (NLLB, M2M-100, OPUS-MT codes too)

The splitter is Wikimedia's sentencex (the `split` extra: `pip install 'edgeseq[split]'`):
rule-based, ~300 languages with fallbacks, its rules compiled into the wheel, so it needs no
data download at run time. It is imported when an input is first split; without it the call
raises MissingDependencyError naming the extra. Its language is the source language of the
options (a multilingual model's code, mapped to ISO 639-1 where it has one), else English's
rules, which suit most languages written with full stops.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import MissingDependencyError

SPLIT_EXTRA = "split"
DEFAULT_LANGUAGE = "en"
# Languages written without a space between sentences: their outputs join with "".
NO_SPACE = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo", "yue", "wuu"})
# ISO 639-3 (NLLB's, OPUS-MT's codes) -> ISO 639-1 for languages whose rules sentencex names so.
ISO_639_1 = {
    "eng": "en", "deu": "de", "fra": "fr", "spa": "es", "ita": "it", "por": "pt", "nld": "nl",
    "rus": "ru", "ukr": "uk", "pol": "pl", "ces": "cs", "slk": "sk", "slv": "sl", "hrv": "hr",
    "srp": "sr", "bul": "bg", "ron": "ro", "hun": "hu", "fin": "fi", "est": "et", "lvs": "lv",
    "lit": "lt", "swe": "sv", "dan": "da", "nob": "nb", "nno": "nn", "isl": "is", "ell": "el",
    "tur": "tr", "ara": "ar", "arb": "ar", "heb": "he", "pes": "fa", "fas": "fa", "hin": "hi",
    "ben": "bn", "urd": "ur", "tam": "ta", "tel": "te", "mar": "mr", "guj": "gu", "kan": "kn",
    "mal": "ml", "pan": "pa", "zho": "zh", "cmn": "zh", "jpn": "ja", "kor": "ko", "tha": "th",
    "vie": "vi", "ind": "id", "zsm": "ms", "msa": "ms", "cat": "ca", "eus": "eu", "glg": "gl",
    "amh": "am", "mya": "my", "khm": "km", "lao": "lo", "bod": "bo",
}  # fmt: skip


def splitter_language(code: str | None) -> str:
    """The splitter's language for a model's language code ("eng_Latn", "__en__",
    ">>deu<<", "fr"): ISO 639-1 where known, else the code's language part; DEFAULT_LANGUAGE
    for None."""
    if not code:
        return DEFAULT_LANGUAGE
    part = re.split(r"[_\-]", code.strip("_<> ").lower(), maxsplit=1)[0]
    return ISO_639_1.get(part, part) or DEFAULT_LANGUAGE


def _segmenter() -> Any:
    """sentencex's `segment(language, text)`, imported on first use."""
    try:
        from sentencex import segment
    except ImportError:
        raise MissingDependencyError(
            "sentence splitting needs the sentencex package: pip install "
            f"'edgeseq[{SPLIT_EXTRA}]' (or drop --split-sentences / split_sentences)"
        ) from None
    return segment


def sentences(text: str, language: str) -> list[str]:
    """The sentences of `text` in order, stripped, empty ones dropped; [text] when it has
    none (an empty or blank input stays one input, generate skips it as before)."""
    found = [s.strip() for s in _segmenter()(language, text)]
    return [s for s in found if s] or [text]


def joiner(language: str | None) -> str:
    """What goes between the outputs of one input's sentences: "" for a target language
    written without spaces (NO_SPACE), else " "."""
    return "" if splitter_language(language) in NO_SPACE else " "
