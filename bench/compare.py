"""The comparison behind `edgeseq bench`: every engine, in rounds, and the ratios between them.

    report = run_benchmark("bundles/g2p", spec, checkpoint="runs/g2p/best", rounds=3)
    report["ratios"]["fp32"]["1"]["tokens_per_s"]     # ORT fp32 / PyTorch eager at batch 1

Each round runs every engine once, each in a fresh process (`timing.run_isolated`): PyTorch
eager first and the variants after in even rounds, the reverse order in odd ones, so that
a load that rises or falls during the run (other jobs on a shared machine) does not favour
one engine. An engine's numbers are computed over the timed passes of all rounds; a ratio
is the median over rounds of the ratio measured within each round.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.search_timing import BenchSpec, summarize

from .graph_worker import graph_jobs, graph_vs_loop
from .isolated import ORT_WORKER, TORCH_WORKER, WorkerError, run_isolated

Engine = dict[str, Any]  # one engine's result as a worker prints it (see ort_worker.measure_ort)


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: cores, load average, Python, platform."""
    return {
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_before": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }


def merge_rounds(runs: list[Engine]) -> Engine:
    """One engine's results of several rounds as one: statistics over every timed pass of
    every round, median load time, largest peak RSS."""
    merged = dict(runs[0])
    merged["rounds"] = len(runs)
    merged["load_s"] = float(np.median([r["load_s"] for r in runs]))
    merged["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    merged["batches"] = {
        batch: summarize([p for r in runs for p in r["batches"][batch]["passes"]])
        for batch in runs[0]["batches"]
    }
    for batch, stats in merged["batches"].items():
        stats["tokens_per_s_rounds"] = [r["batches"][batch]["tokens_per_s"] for r in runs]
    return merged


def ratios(rounds: list[dict[str, Engine]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per onnxruntime variant and batch size, against PyTorch eager of the same round,
    median over rounds: `tokens_per_s` (ORT / PyTorch), `seq_ms_p50` (PyTorch / ORT: > 1
    means ORT is faster), and `same_tokens` (as many tokens generated in every round: a
    cheap check that both did the same work). `rounds`: per round, engine key -> result."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key in rounds[0]:
        if key == "pytorch":
            continue
        per_batch = {}
        for batch in rounds[0][key]["batches"]:
            pairs = [
                (r[key]["batches"][batch], r["pytorch"]["batches"][batch])
                for r in rounds
                if key in r and "pytorch" in r and batch in r["pytorch"]["batches"]
            ]
            if not pairs:
                continue
            speed = [ort["tokens_per_s"] / ref["tokens_per_s"] for ort, ref in pairs]
            per_batch[batch] = {
                "tokens_per_s": float(np.median(speed)),
                "tokens_per_s_rounds": speed,
                "seq_ms_p50": float(
                    np.median([r["seq_ms_p50"] / o["seq_ms_p50"] for o, r in pairs])
                ),
                "same_tokens": all(o["tokens"] == r["tokens"] for o, r in pairs),
            }
        if per_batch:
            out[key.removeprefix("ort:")] = per_batch
    return out


def run_benchmark(
    bundle_dir: str | Path,
    spec: BenchSpec,
    checkpoint: str | Path | None = None,
    variants: Sequence[str] | None = None,
    provider: str = "cpu",
    optimization: str = "all",
    inputs: str = "",
    rounds: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure PyTorch eager (with `checkpoint`) and every variant of the bundle's manifest
    (or `variants`) in `rounds` rounds (see the module docstring). `provider` and
    `optimization` (graph optimization level) apply to onnxruntime; `inputs` says where
    spec.sources came from. A variant whose process fails (e.g. fp16 on a CPU provider that
    cannot run it) is listed under "skipped" with the reason and not tried again;
    WorkerError when no onnxruntime variant ran or PyTorch failed."""
    say = progress or (lambda _: None)
    spec.check()
    if rounds < 1:
        raise OptionsError(f"rounds must be >= 1, got {rounds}")
    bundle = load_bundle(bundle_dir)
    machine = machine_info()
    jobs: dict[str, tuple[str, dict[str, Any]]] = {}
    if checkpoint is not None:
        config = bundle.config.to_dict()
        jobs["pytorch"] = (TORCH_WORKER, {"checkpoint": str(checkpoint), "config": config})
    for variant in variants or sorted(bundle.variants, key=lambda v: (v != "fp32", v)):
        extra = dict(bundle=str(bundle.path), variant=variant, provider=provider)
        jobs[f"ort:{variant}"] = (ORT_WORKER, extra | {"optimization": optimization})
    if spec.target_prefix:  # the one-graph search variant forces no target language
        say("the search graph is not timed: it cannot force the target language")
    else:
        jobs |= graph_jobs(bundle, variants, provider, optimization)
    results: list[dict[str, Engine]] = []
    skipped: dict[str, str] = {}
    for round_index in range(rounds):
        order = list(jobs) if round_index % 2 == 0 else list(reversed(jobs))
        results.append({})
        for key in order:
            if key in skipped:
                continue
            code, extra = jobs[key]
            say(f"round {round_index + 1}/{rounds}: {key.replace('ort:', 'onnxruntime ')}")
            try:
                results[-1][key] = run_isolated(code, spec, **extra)
            except WorkerError as exc:
                if key == "pytorch":
                    raise WorkerError(
                        f"PyTorch measurement of {checkpoint} failed: {exc}"
                    ) from None
                skipped[key] = str(exc)
    ran = [key for key in jobs if key in results[0]]
    if not any(key.startswith("ort:") for key in ran):
        reasons = "; ".join(f"{k.removeprefix('ort:')}: {r}" for k, r in skipped.items())
        raise WorkerError(f"no onnxruntime variant of {bundle.path} could run ({reasons})")
    machine["loadavg_after"] = list(os.getloadavg())
    settings = {k: v for k, v in asdict(spec).items() if k not in ("sources", "extra")}
    settings |= {"inputs": len(spec.sources), "inputs_from": inputs, "provider": provider}
    settings |= {"optimization": optimization, "rounds": rounds}
    settings["search"] = "greedy" if spec.beam_size == 1 else f"beam {spec.beam_size}"
    return {
        "bundle": str(bundle.path),
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
        "machine": machine,
        "settings": settings,
        "engines": [merge_rounds([r[key] for r in results if key in r]) for key in ran],
        "skipped": [{"variant": k.removeprefix("ort:"), "reason": r} for k, r in skipped.items()],
        "ratios": ratios(results),
        "graph_vs_loop": graph_vs_loop(results),
    }
