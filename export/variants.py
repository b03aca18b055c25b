"""The variants a bundle can carry and the manifest's `variants` table, for every kind.

    options = VariantOptions(names=parse_variants("int8,ort"), max_metric_drop=0.5)
    check_supported(options.names, ("fp32", "int8"), "gpt")      # OptionsError otherwise
    finish_table(directory, table, files, precision)              # sizes, ratios, defaults

Precision variants (fp32, int8, fp16, ORT format) are whole copies of a kind's graphs, each
behind the accuracy gate (export/gate.py); graph variants (search, steps, inplace: the
registry in runtime/graph_variants.py) are extra encoder–decoder graphs
(export/kinds/seq2seq/graph_variants.py). Each kind builds the ones it supports and refuses
the others with one line. Schema of the table's entries: docs/export.md ("The `variants`
table of manifest.json").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.graph_variants import GRAPH_VARIANTS

from .external_data import graph_bytes
from .limits import DEFAULT_MAX_METRIC_DROP
from .quantize import PER_CHANNEL, REDUCE_RANGE

PRECISIONS = ("fp32", "int8", "fp16", "ort")
VARIANT_NAMES = (*PRECISIONS, *GRAPH_VARIANTS)
SPEED_INPUTS = 50  # held-out inputs decoded one at a time for tokens/s


@dataclass(frozen=True)
class VariantOptions:
    """Which variants to build and how strictly to gate them."""

    names: tuple[str, ...] = ("fp32",)  # always starts with fp32
    max_metric_drop: float = DEFAULT_MAX_METRIC_DROP  # points; int8 searches to meet it
    quantize_all: bool = False  # int8: also the embeddings (and a one-graph output head)
    per_channel: bool = PER_CHANNEL  # int8: one scale per output channel
    reduce_range: bool = REDUCE_RANGE  # int8: 7-bit weights, no saturation without VNNI
    speed_inputs: int = SPEED_INPUTS


def parse_variants(text: str) -> tuple[str, ...]:
    """ "int8,ort" -> ("fp32", "int8", "ort"): fp32 always first, no repeats; OptionsError
    naming the known variants for anything else."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in VARIANT_NAMES]
    if unknown:
        raise OptionsError(
            f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANT_NAMES)}"
        )
    return tuple(n for n in VARIANT_NAMES if n == "fp32" or n in names)


def check_supported(names: Sequence[str], supported: Sequence[str], kind: str) -> None:
    """OptionsError naming the variants in `names` that `kind` bundles do not have."""
    unknown = [n for n in names if n not in supported]
    if unknown:
        raise OptionsError(
            f"variants {', '.join(unknown)} are not built for {kind} bundles; choose from "
            f"{', '.join(supported)}"
        )


def finish_table(
    directory: Path,
    table: dict[str, dict[str, Any]],
    files: Mapping[str, Mapping[str, str]],
    precision: Mapping[str, str],
) -> None:
    """Complete each entry of a `variants` table in place: its graph files (`files[name]`:
    role -> file name), precision, format, bytes and size relative to fp32, and `gate` and
    `speed` left null when not measured."""

    def size(name: str) -> int:
        return sum(graph_bytes(directory / f) for f in files[name].values())

    fp32_bytes = size("fp32")
    for name, entry in table.items():
        entry.update(files[name], precision=precision[name])
        entry.update(format="ort" if name == "ort" else "onnx", bytes=size(name))
        entry["size_ratio"] = round(entry["bytes"] / fp32_bytes, 4)
        entry.setdefault("gate", None)
        entry.setdefault("speed", None)
