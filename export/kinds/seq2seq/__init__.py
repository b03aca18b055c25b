"""The encoder–decoder kind in export: `encoder.onnx` + `decoder.onnx` (+ the graph
variants: the one-graph search, the step-batching and in-place cache decoders), verified at
the three parity levels, against the source model for an import, and per graph variant.

    manifest = export(source, "bundles/rev", ExportOptions())     # the kind interface
    report = verify(load_bundle("bundles/rev"), source, ExportOptions())

| step | module (in this package) |
| --- | --- |
| graph wrappers | wrappers.py (fused attention operators: export/fused_ops.py) |
| encoder and decoder graphs | graphs.py (export/onnx_export.py does the export) |
| parity levels 1-3 | parity_graphs.py (level 1), parity.py (levels 2, 3) |
| parity against an imported source model | source_parity.py |
| int8/fp16/ORT variants and their gates | precisions.py (gate: export/gate.py) |
| graph variants: search, steps, inplace | graph_variants.py and one graph/parity pair each |
| the bundle | bundle.py |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeseq.runtime.bundle import Bundle

from ...options import ExportOptions, held_out, with_parity_budget
from ...sources import SourceModel
from .bundle import prove_graphs, prove_variant, write_bundle
from .graph_variants import VARIANT_EXPORTS, VariantContext

NAME = "encoder-decoder"


def export(source: SourceModel, out: str | Path, options: ExportOptions) -> dict[str, Any]:
    """Write the bundle of `source` (an encoder–decoder) at `out`; return its manifest."""
    options = with_parity_budget(options, source)
    held = held_out(source, options) if options.verify else None
    return write_bundle(
        source.model, source.tokenizers, out, options, task=source.task, held=held,
        reference=source.reference, languages=source.languages,
        generation=source.generation.settings if source.generation else None,
        task_prefixes=source.task_prefixes,
    )  # fmt: skip


def verify(bundle: Bundle, source: SourceModel, options: ExportOptions) -> dict[str, Any]:
    """Parity levels 1-3 of the bundle's fp32 graphs against `source`'s model, the group
    against the source model when it is an import, and the parity group of every graph
    variant the manifest lists; ParityError when one fails."""
    options = with_parity_budget(options, source)
    held = held_out(source, options)
    model, say = source.model, options.say
    graphs = dict(zip(("encoder", "decoder"), bundle.graphs("fp32"), strict=True))
    report = prove_graphs(graphs, model, held, source.reference, options.max_new_tokens, say)
    context = VariantContext(
        bundle.path, model, source.tokenizers, bundle.manifest["variants"], held,
        options.max_new_tokens, progress=say,
    )  # fmt: skip
    for key, variant in VARIANT_EXPORTS.items():
        precisions = variant.precisions(bundle.manifest.get(key) or {})
        if precisions:
            prove_variant(key, precisions, context, report)
    return report
