"""The export side of the extra graphs an encoder–decoder bundle may hold: one descriptor per
graph variant of runtime/graph_variants.py's registry, which export and verify loop over.

    for variant in requested(options.variants.names):
        entry = variant.write(context)                     # its graphs, per precision
        group = variant.parity(context, precisions(entry)) # its parity group
        check_group(report, variant.key, variant.failure)

| key | graphs | parity group |
| --- | --- | --- |
| search | search_graph.py, search_parity.py `write_search_graphs` | search_parity.py |
| steps | steps_graph.py `write_steps_graphs` | steps_parity.py |
| inplace | in_place_graph.py `write_in_place_graphs` | in_place_parity.py |

A new graph variant is a descriptor in runtime/graph_variants.py (manifest key, files,
documented inputs and outputs: what every opener checks), one here (how to write its graphs,
its parity group and the message when it fails), its report rows (export/report.py
`PARITY_ROWS`) and the runtime code that uses it. Export, `edgeseq verify`, `inspect`,
loading and the hostile-bundle tests then cover it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import graph_variants as runtime
from edgeseq.runtime.tokenizer import TokenizerPair

from ...heldout import HeldOut
from .float64_noise import ModelNoise
from .in_place_graph import write_in_place_graphs
from .in_place_parity import in_place_failure, in_place_parity_group
from .search_parity import search_failure, search_parity_group, write_search_graphs
from .steps_graph import write_steps_graphs
from .steps_parity import steps_failure, steps_parity_group

# Measured with the g2p-en bundle on each onnxruntime release (docs/bundle.md): BeamSearch
# refuses the search graph's two-input encoder subgraph before 1.22 (1.21.1:
# "subgraph_t5_encoder ... expect 3 inputs").
MIN_ORT_SEARCH_GRAPH = "1.22.0"


@dataclass
class VariantContext:
    """What writing a graph variant and measuring its parity read: the bundle directory
    being written (or verified), the model, the held-out inputs (None: --no-verify) and the
    export options."""

    directory: Path
    model: Seq2SeqTransformer
    tokenizers: TokenizerPair
    table: dict[str, dict[str, Any]]  # the manifest's `variants` (precisions present)
    held: HeldOut | None
    max_new_tokens: int | None = None
    opset: int | None = None
    fuse: bool = True
    metadata: dict[str, str] | None = None
    progress: Callable[[str], None] | None = None

    @property
    def limit(self) -> int:
        """The step budget of the parity decodes."""
        return self.max_new_tokens if self.max_new_tokens is not None else self.model.cfg.max_len

    @cached_property
    def noise(self) -> ModelNoise | None:
        """The model's float32 logits error on the held-out inputs (measured when a group's
        fp32 numbers miss the flat tolerance); None without held-out inputs."""
        return ModelNoise(self.model, self.held.sources) if self.held is not None else None


@dataclass(frozen=True)
class VariantExport:
    """How export writes one graph variant and proves it (see the module docstring)."""

    graphs: runtime.GraphVariant  # key, files per precision, inputs and outputs
    announce: str  # the progress line when export starts it
    write: Callable[[VariantContext], dict[str, Any]]  # -> its manifest entry
    parity: Callable[[VariantContext, list[str]], dict[str, Any]]  # -> its report group
    failure: Callable[[dict[str, Any]], str]  # a failed group's ParityError message
    needs_fuse: bool = False  # built from fused operators only: refused with --no-fuse
    min_onnxruntime: str | None = None  # oldest onnxruntime that runs it

    @property
    def key(self) -> str:
        """The variant's name: `--variants`, manifest and report key."""
        return self.graphs.key

    def precisions(self, entry: dict[str, Any]) -> list[str]:
        """The precisions a manifest entry of this variant lists, fp32 first."""
        return [p for p in self.graphs.files if isinstance(entry.get(p), dict)]


def _write_search(c: VariantContext) -> dict[str, Any]:
    return write_search_graphs(c.directory, c.model.cfg, c.table, c.progress)


def _search_parity(c: VariantContext, precisions: list[str]) -> dict[str, Any]:
    assert c.held is not None, "parity needs the held-out inputs"
    return search_parity_group(
        c.directory, c.model.cfg, c.tokenizers, precisions, c.held, c.limit, c.progress
    )


def _write_steps(c: VariantContext) -> dict[str, Any]:
    return write_steps_graphs(
        c.directory, c.model, c.table, opset=c.opset, fuse=c.fuse, metadata=c.metadata,
        progress=c.progress,
    )  # fmt: skip


def _steps_parity(c: VariantContext, precisions: list[str]) -> dict[str, Any]:
    assert c.held is not None, "parity needs the held-out inputs"
    return steps_parity_group(
        c.directory, c.model.cfg, precisions, c.held.sources, c.progress, c.noise
    )


def _write_in_place(c: VariantContext) -> dict[str, Any]:
    return write_in_place_graphs(
        c.directory, c.model, c.table, opset=c.opset, metadata=c.metadata, progress=c.progress
    )


def _in_place_parity(c: VariantContext, precisions: list[str]) -> dict[str, Any]:
    assert c.held is not None, "parity needs the held-out inputs"
    return in_place_parity_group(
        c.directory, c.model.cfg, precisions, c.held.sources, c.max_new_tokens, c.progress,
        c.noise,
    )  # fmt: skip


VARIANT_EXPORTS: dict[str, VariantExport] = {
    v.key: v
    for v in (
        VariantExport(
            runtime.STEPS,
            "variant steps: a decoder for step batching (rows at different positions)",
            _write_steps,
            _steps_parity,
            steps_failure,
        ),
        VariantExport(
            runtime.IN_PLACE,
            "variant inplace: a decoder whose cache is written in place (beam search)",
            _write_in_place,
            _in_place_parity,
            in_place_failure,
            needs_fuse=True,
        ),
        VariantExport(
            runtime.SEARCH,
            "variant search: one BeamSearch graph per precision",
            _write_search,
            _search_parity,
            search_failure,
            min_onnxruntime=MIN_ORT_SEARCH_GRAPH,
        ),
    )
}


def requested(names: Sequence[str]) -> list[VariantExport]:
    """The descriptors of the graph variants among `names`, in build order (the search graph
    last: it wraps the finished encoder and decoder of every precision)."""
    return [v for key, v in VARIANT_EXPORTS.items() if key in names]
