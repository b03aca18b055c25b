"""The encoder–decoder kind in export: `encoder.onnx` + `decoder.onnx` (+ the one-graph
search variant), verified at the three parity levels. The work is done by the modules this
kind was built on; this module is its entry in the registry.

    manifest = export(model, tokenizers, "bundles/rev", task=task, held=held)
    report = verify(Path("bundles/rev"), manifest, model, tokenizers, held)

| step | module |
| --- | --- |
| graph wrappers, fused operators | export/wrappers.py, export/fused_ops.py |
| torch.onnx export, checks | export/onnx_export.py |
| parity levels 1-3 | export/parity_graphs.py, export/verify.py |
| int8/fp16/ORT variants and their gates | export/variants.py, export/quantize.py |
| one-graph BeamSearch variant | export/search_graph.py, export/search_parity.py |
| step-batching decoder variant | export/steps_graph.py, export/steps_parity.py |
| the bundle | export/bundle.py |
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.tokenizer import TokenizerPair

from ..bundle import export_bundle
from ..heldout import HeldOut
from ..search_parity import check_search_parity, search_parity_group
from ..source_parity import check_source_parity, source_parity
from ..sources import SourceReference
from ..steps_parity import check_steps_parity, steps_parity_group
from ..verify import check_parity, open_engine, run_parity

NAME = "encoder-decoder"
export = export_bundle  # (model, tokenizers, out, *, task, held, ..., fuse) -> manifest


def verify(
    bundle: Path,
    manifest: dict[str, Any],
    model: Seq2SeqTransformer,
    tokenizers: TokenizerPair,
    held: HeldOut,
    progress: Callable[[str], None] | None = None,
    reference: SourceReference | None = None,
) -> dict[str, Any]:
    """Parity levels 1-3 of the bundle's fp32 graphs against `model`, the group against the
    source model when `reference` is given (an imported model), and the search variant's
    group and the steps decoder's when the bundle has them; ParityError when a level fails."""
    say = progress or (lambda _: None)
    variant = manifest["variants"]["fp32"]
    engine = open_engine(bundle / variant["encoder"], bundle / variant["decoder"], model.cfg)
    report = run_parity(
        model,
        engine,
        held.sources,
        source_description=held.description,
        texts=held.texts,
        progress=say,
    )
    check_parity(report)
    if reference is not None:
        say(f"parity against the source model on {len(held.sources)} inputs")
        report["source"] = source_parity(reference, engine, held, model.cfg)
        report["passed"] = report["passed"] and report["source"]["passed"]
        check_source_parity(report)
    precisions = [p for p in C.SEARCH_FILES if p in (manifest.get("search") or {})]
    if precisions:  # the one-graph search variant: its parity group again
        group = search_parity_group(
            bundle, model.cfg, tokenizers, precisions, held, model.cfg.max_len, say
        )
        report["search"] = group
        report["passed"] = report["passed"] and group["passed"]
        check_search_parity(report)
    steps = [p for p in C.STEPS_FILES if p in (manifest.get("steps") or {})]
    if steps:  # the step-batching decoder: its parity group again
        report["steps"] = steps_parity_group(bundle, model.cfg, steps, held.sources, say)
        report["passed"] = report["passed"] and report["steps"]["passed"]
        check_steps_parity(report)
    return report
