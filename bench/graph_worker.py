"""Time the one-graph search variant for `edgeseq bench`, next to the Python loop.

    jobs |= graph_jobs(bundle, variants, provider, optimization)  # {"ort:search-fp32": ...}
    report["graph_vs_loop"] = graph_vs_loop(rounds)               # tokens/s graph / loop
    lines += graph_lines(report)                                  # Markdown sentences

A job runs this module in a fresh torch-free process like every onnxruntime variant
(`run_isolated` with `GRAPH_WORKER`) and times `GraphSearch.search` on the same batches,
search and thread count as the loop's `time_search`. Its engine entry has the same
fields, so the report's table lists it as "onnxruntime fp32 search graph"; its decoder
steps per batch are the longest best hypothesis (`</s>` included), which is what the loop
steps through at greedy.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeseq.runtime.bundle import Bundle
from edgeseq.runtime.graph_variants import SEARCH
from edgeseq.runtime.search import GenerationOptions
from edgeseq.runtime.search_timing import BenchSpec, batches, summarize

from .isolated import peak_rss_mb
from .ort_worker import block_torch

GRAPH_WORKER = "edgeseq.bench.graph_worker"
PREFIX = "search-"  # engine variant names: "search-fp32", "search-int8"


def graph_jobs(
    bundle: Bundle, variants: Sequence[str] | None, provider: str, optimization: str
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Bench jobs for every search graph of the bundle whose precision is benchmarked
    (every one, or those in `variants`)."""
    jobs = {}
    for precision in bundle.graph_variants.get(SEARCH.key, {}):
        if variants is None or precision in variants:
            extra = dict(bundle=str(bundle.path), precision=precision, provider=provider)
            jobs[f"ort:{PREFIX}{precision}"] = (
                GRAPH_WORKER,
                extra | {"optimization": optimization},
            )
    return jobs


def _pass(
    graph: Any, src_batches: list[np.ndarray], options: GenerationOptions
) -> list[tuple[float, int, int, int]]:
    """One pass over every batch: per batch (seconds, rows, tokens, steps)."""
    records = []
    for src_ids in src_batches:
        start = time.perf_counter()
        hyps = graph.search(src_ids, options)
        seconds = time.perf_counter() - start
        lengths = [len(h[0].tokens) + h[0].finished for h in hyps]
        records.append((seconds, src_ids.shape[0], sum(lengths), max(lengths)))
    return records


def time_graph(graph: Any, spec: BenchSpec) -> dict[str, dict[str, Any]]:
    """`time_search`'s statistics for `graph.search` (a GraphSearch) per batch size."""
    out = {}
    for batch_size in spec.batch_sizes:
        options = spec.options(batch_size)
        src_batches = batches(spec.sources, batch_size, graph.config.pad_id)
        if spec.warmup:
            _pass(graph, src_batches, options)
        gc.collect()
        gc.disable()
        try:
            passes = [_pass(graph, src_batches, options) for _ in range(spec.repeats)]
        finally:
            gc.enable()
        out[str(batch_size)] = summarize(passes)
    return out


def measure_graph(
    bundle_dir: str | Path, precision: str, spec: BenchSpec, provider: str, optimization: str
) -> dict[str, Any]:
    """Load the bundle's search graph of `precision` and time it (`measure_ort`'s fields)."""
    import onnxruntime as ort

    from edgeseq.runtime.bundle import load_bundle
    from edgeseq.runtime.graph_search import GraphSearch
    from edgeseq.runtime.graph_variants import graph_variant_path
    from edgeseq.runtime.providers import CPU_EP, session_options

    baseline = peak_rss_mb()
    start = time.perf_counter()
    bundle = load_bundle(bundle_dir)
    checked = time.perf_counter()
    path = graph_variant_path(bundle, SEARCH.key, precision)
    providers = ["CUDAExecutionProvider", CPU_EP] if provider == "cuda" else [CPU_EP]
    graph = GraphSearch.open(
        bundle, precision, providers, session_options(spec.threads, optimization)
    )
    loaded = time.perf_counter()
    assert graph is not None and path is not None  # graph_jobs only lists existing graphs
    return {
        "engine": f"onnxruntime {precision} search graph",
        "kind": "onnxruntime",
        "variant": f"{PREFIX}{precision}",
        "device": "cuda" if "CUDAExecutionProvider" in graph.session.get_providers() else "cpu",
        "providers": graph.session.get_providers(),
        "version": ort.__version__,
        "threads": spec.threads,
        "optimization": optimization,
        "bundle_check_s": checked - start,
        "load_s": loaded - checked,
        "file_bytes": path.stat().st_size,
        "files": [path.name],
        "baseline_rss_mb": baseline,
        "peak_rss_mb": peak_rss_mb(),
        "torch_imported": "torch" in sys.modules,
        "batches": time_graph(graph, spec),
    }


def main(argv: list[str] | None = None) -> None:
    """Worker entry: `SPEC.json` whose `extra` has bundle, precision, provider, optimization;
    prints one JSON line with `measure_graph`'s result. Torch is blocked first."""
    block_torch()
    (spec_path,) = argv if argv is not None else sys.argv[1:]
    spec = BenchSpec.load(spec_path)
    extra = spec.extra
    result = measure_graph(
        extra["bundle"], extra["precision"], spec, extra["provider"], extra["optimization"]
    )
    print(json.dumps(result))


def graph_vs_loop(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per search graph and batch size: its tokens/s / the loop's of the same precision in
    the same round, median over rounds. `rounds`: per round, engine key -> result."""
    out: dict[str, dict[str, float]] = {}
    for key in rounds[0]:
        if not key.startswith(f"ort:{PREFIX}"):
            continue
        loop_key = "ort:" + key.removeprefix(f"ort:{PREFIX}")
        per_batch = {}
        for batch in rounds[0][key]["batches"]:
            speed = [
                r[key]["batches"][batch]["tokens_per_s"]
                / r[loop_key]["batches"][batch]["tokens_per_s"]
                for r in rounds
                if key in r and loop_key in r
            ]
            if speed:
                per_batch[batch] = float(np.median(speed))
        if per_batch:
            out[key.removeprefix("ort:")] = per_batch
    return out


def graph_lines(report: dict[str, Any]) -> list[str]:
    """Markdown sentences: each search graph's tokens/s relative to the Python loop."""
    lines = []
    for variant, per_batch in (report.get("graph_vs_loop") or {}).items():
        cells = ", ".join(f"{ratio:.2f}× at batch {b}" for b, ratio in per_batch.items())
        loop = variant.removeprefix(PREFIX)
        lines.append(f"- {variant} (one session.run per batch) vs the {loop} loop: {cells}")
    return lines


if __name__ == "__main__":
    main()
