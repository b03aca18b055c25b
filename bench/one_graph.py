"""`edgeseq bench` for GPT and BERT bundles: every variant's one graph, torch-free, in this
process (the encoder–decoder's per-variant worker processes are in bench/compare.py).

    report = bench_one_graph(bundle, spec, None, "cpu", "all", "task words, test split")
    print(one_graph_markdown(report))

GPT: the search of `spec` (greedy or beam) continues each source, a prompt, through
`OrtGPTStep`; tokens/s counts generated tokens plus `</s>` where it ended, as for the
encoder–decoder (runtime/search_timing.py). The budget per batch is what its longest prompt
leaves of max_len (or --max-new-tokens, whichever is smaller). BERT: one graph call per batch;
sequences/s and the latency of a batch.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import Bundle, check_model_graph
from edgeseq.runtime.kinds.decoder_only import OrtGPTStep
from edgeseq.runtime.providers import open_session
from edgeseq.runtime.search_timing import BenchSpec, batches, time_search

from .isolated import peak_rss_mb


def _gpt(bundle: Bundle, session: Any, spec: BenchSpec) -> dict[str, Any]:
    """Per batch size: time_search's statistics over the prompts (sources without `</s>`)."""
    prompts = [ids[:-1] if ids and ids[-1] == bundle.config.eos_id else ids for ids in spec.sources]
    room = bundle.config.max_len - 1 - max(len(p) for p in prompts)
    budget = room if spec.max_new_tokens is None else min(room, spec.max_new_tokens)
    fitted = dataclasses.replace(spec, sources=prompts, max_new_tokens=max(budget, 1))
    return time_search(OrtGPTStep(session, bundle.config), fitted)


def _bert(bundle: Bundle, session: Any, spec: BenchSpec) -> dict[str, Any]:
    """Per batch size: sequences/s (median over passes) and batch latency percentiles."""
    out = {}
    for batch_size in spec.batch_sizes:
        feeds = [
            {C.INPUT_IDS: ids, C.ATTENTION_MASK: (ids != bundle.config.pad_id).astype(np.int64)}
            for ids in batches(spec.sources, batch_size, bundle.config.pad_id)
        ]
        for feed in feeds if spec.warmup else ():
            session.run(None, feed)
        rates, latencies = [], []
        gc.collect()
        gc.disable()
        try:
            for _ in range(spec.repeats):
                total = 0.0
                for feed in feeds:
                    start = time.perf_counter()
                    session.run(None, feed)
                    seconds = time.perf_counter() - start
                    latencies.append(1000 * seconds)
                    total += seconds
                rates.append(len(spec.sources) / total)
        finally:
            gc.enable()
        out[str(batch_size)] = {
            "sequences_per_s": float(np.median(rates)),
            "sequences_per_s_runs": rates,
            "batch_ms_p50": float(np.percentile(latencies, 50)),
            "batch_ms_p90": float(np.percentile(latencies, 90)),
            "inputs": len(spec.sources),
        }
    return out


def bench_one_graph(
    bundle: Bundle,
    spec: BenchSpec,
    variants: tuple[str, ...] | None,
    provider: str,
    optimization: str,
    described: str,
    progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Time every variant of a GPT or BERT bundle (or `variants`) on `spec`; the report."""
    kind = "gpt" if bundle.architecture == C.DECODER_ONLY else "bert"
    results = {}
    for variant in variants or sorted(bundle.variants, key=lambda v: (v != "fp32", v)):
        progress(f"onnxruntime {variant}")
        path = bundle.model_graph(variant)
        start = time.perf_counter()
        session, device = open_session(path, provider, spec.threads, optimization)
        load_ms = 1000 * (time.perf_counter() - start)
        check_model_graph(bundle, session, variant)
        timed = _gpt(bundle, session, spec) if kind == "gpt" else _bert(bundle, session, spec)
        results[variant] = {
            "device": device,
            "load_ms": load_ms,
            "mb": path.stat().st_size / 1e6,
            "batches": timed,
        }
    return {
        "kind": kind,
        "bundle": str(bundle.path),
        "inputs": described,
        "threads": spec.threads,
        "beam_size": spec.beam_size,
        "results": results,
        "peak_rss_mb": peak_rss_mb(),
    }


def one_graph_markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table: one row per variant and batch size."""
    gpt = report["kind"] == "gpt"
    rate, latency = ("tokens/s", "seq ms p50") if gpt else ("sequences/s", "batch ms p50")
    rows = [("variant", "device", "MB", "load ms", "batch", rate, latency)]
    for variant, result in report["results"].items():
        for size, stats in result["batches"].items():
            rows.append((
                variant, result["device"], f"{result['mb']:.2f}", f"{result['load_ms']:.0f}",
                size,
                f"{stats['tokens_per_s' if gpt else 'sequences_per_s']:.0f}",
                f"{stats['seq_ms_p50' if gpt else 'batch_ms_p50']:.2f}",
            ))  # fmt: skip
    search = "greedy" if report["beam_size"] == 1 else f"beam {report['beam_size']}"
    what = f"{'GPT' if gpt else 'BERT'} bundle {report['bundle']}"
    head = f"{what}: {report['inputs']}, {report['threads']} thread(s)"
    head += f", {search}" if gpt else ""
    table = [f"| {' | '.join(row)} |" for row in rows]
    table.insert(1, "|" + "---|" * len(rows[0]))
    return head + "\n\n" + "\n".join(table) + "\n"
