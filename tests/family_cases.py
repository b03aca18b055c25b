"""The Hugging Face families of issue 45 exported once per test session (conftest.py's
`family_import` fixture), for tests/test_import_families_downstream.py: each a tiny
checkpoint of the fixture modules trained to copy words, exported by `edgeseq export DIR
--data data.tsv --variants FAMILY_VARIANTS` (without `search` for LANGUAGE_FAMILIES), every
variant gated on FAMILY_ROWS' inputs and references.

- "m2m_100": tests/m2m_fixtures.py's NLLB layout (SentencePiece BPE, `fra_Latn` forced first);
- "mbart-50": tests/mbart_fixtures.py's mBART-50 (Unigram, pre-norm, `fr_XX` forced first);
- "bart": tests/mbart_fixtures.py's BART (byte-level BPE, post-norm);
- "t5": tests/t5_fixtures.py's T5 v1.1 / Flan-T5 layout (gated-GELU, relative position
  buckets, untied output).

`export_family(name, root)` returns {"source", "data", "bundle", "output"} as
tests/import_cases.py's `export_marian` does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from import_cases import export_with_data

FAMILY_VARIANTS = "fp32,int8,fp16,ort,search"
# Models with a language list force the target language, which the search graph cannot
# (export refuses `search` for them: export/pipeline.py).
LANGUAGE_FAMILIES = ("m2m_100", "mbart-50")
COPY_STEPS = 200
FAMILY_ROWS = 20  # held-out words, each its own reference


def family_rows() -> list[str]:
    """`word TAB word` for FAMILY_ROWS words of the source corpus (the copy models' task)."""
    from hf_fixtures import synthetic_corpus

    words = dict.fromkeys(line.split()[0] for line in synthetic_corpus("source", 80, seed=11))
    return [f"{word}\t{word}" for word in list(words)[:FAMILY_ROWS]]


def _m2m_100(path: Path) -> Path:
    from m2m_fixtures import build_m2m_dir

    return build_m2m_dir(path, copy_steps=COPY_STEPS)


def _mbart_50(path: Path) -> Path:
    from mbart_fixtures import build_mbart50_dir

    return build_mbart50_dir(path, copy_steps=COPY_STEPS)


def _bart(path: Path) -> Path:
    from mbart_fixtures import build_bart_dir

    return build_bart_dir(path, copy_steps=COPY_STEPS)


def _t5(path: Path) -> Path:
    from t5_fixtures import build_t5_dir

    return build_t5_dir(path, version="1.1", copy_steps=COPY_STEPS)


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "m2m_100": _m2m_100,
    "mbart-50": _mbart_50,
    "bart": _bart,
    "t5": _t5,
}


def export_family(name: str, root: Path) -> dict[str, Any]:
    """Family `name`'s copy-trained checkpoint and its bundle (see the module docstring)."""
    source = BUILDERS[name](root / name)
    data = root / "data.tsv"
    data.write_text("\n".join(family_rows()) + "\n", encoding="utf-8")
    variants = FAMILY_VARIANTS.removesuffix(",search") if name in LANGUAGE_FAMILIES else None
    return export_with_data(source, data, root / "bundle", variants or FAMILY_VARIANTS)
