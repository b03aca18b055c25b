"""Each engine of `edgeseq bench` measured in a fresh Python process.

    result = run_isolated(ORT_WORKER, spec, bundle="b", variant="fp32")  # the worker's JSON

`run_isolated` runs a worker module (`ORT_WORKER` = bench/ort_worker.py, which cannot import
torch, so its peak RSS is what a torch-free deployment needs; `TORCH_WORKER` =
bench/torch_worker.py) with the spec's thread count in the BLAS/OpenMP variables. Each worker
times its engine with `runtime/search_timing.py` and reports `peak_rss_mb`. The whole
comparison (every engine, rounds, ratios) is `bench.compare.run_benchmark`.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edgeseq.runtime.errors import EdgeseqError
from edgeseq.runtime.search_timing import BenchSpec

ORT_WORKER = "edgeseq.bench.ort_worker"  # worker modules, run as `python -m MODULE SPEC.json`
TORCH_WORKER = "edgeseq.bench.torch_worker"
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (ru_maxrss)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, else KiB


class WorkerError(EdgeseqError):
    """A measurement process failed; the message carries the last line of its stderr."""


def run_isolated(module: str, spec: BenchSpec, **extra: Any) -> dict[str, Any]:
    """Run `python -m module SPEC.json` in a fresh process with `spec` (its `extra` updated)
    and the BLAS/OpenMP thread variables set to spec.threads; return the JSON it prints last."""
    spec = BenchSpec(**{**asdict(spec), "extra": {**spec.extra, **extra}})
    env = dict(os.environ, **dict.fromkeys(THREAD_ENV, str(spec.threads)))
    with tempfile.TemporaryDirectory(prefix="edgeseq-bench-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec.save(spec_path)
        proc = subprocess.run(
            [sys.executable, "-m", module, str(spec_path)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        errors = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        reason = errors[-1] if errors else f"exit code {proc.returncode}, no output"
        raise WorkerError(reason)
    return json.loads(lines[-1])
