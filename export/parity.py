"""Parity evidence every model kind reports in the same format: the three levels, their
tolerance and the error that carries the report.

    report = parity_report(level1, level2, level3, "random", started)
    check_parity(report)                  # ParityError naming every failed level
    print(format_parity(report))          # export/report.py

Each kind measures the levels on its own graphs (export/kinds/seq2seq/parity.py for the
encoder–decoder, export/kinds/decoder_only.py and encoder_only.py for GPT and BERT); this
module holds what they share: the fp32 tolerance, |Δ| and top-2 helpers, random held-out
sources, one torch thread while measuring, and the report.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from edgeseq.runtime import constants as C
from edgeseq.runtime.errors import ParityError

TOLERANCE_FP32 = 1e-4  # max |Δ| of any fp32 output vs PyTorch
# Past the tolerance, an output is bounded by TOLERANCE_FP32 + NOISE_FACTOR x PyTorch's own
# float32 error on the same inputs (export/kinds/seq2seq/float64_noise.py)
NOISE_FACTOR = 2.0


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b|; inf when the shapes differ."""
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))


MAX_REPORTED_MISMATCHES = 5


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread: parity does not measure speed, and tiny per-step kernels
    gain nothing from a thread pool. Large models too: on 2 cores with another process busy,
    a T5-base (223 M parameters) greedy decode at level 3's batch 32, 64 steps, took 13 s on
    one thread and 70-109 s on two (tests/test_families_large.py's shape)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def random_sources(model: Any, n: int, seed: int = 0) -> list[list[int]]:
    """`n` random source id lists (non-special ids, then `</s>`), lengths 1..min(24, max_len)."""
    cfg, rng = model.cfg, np.random.default_rng(seed)
    longest = min(24, cfg.max_len)
    lengths = rng.integers(1, longest + 1, size=n)
    first = len(C.SPECIAL_TOKENS)
    return [
        [*rng.integers(first, cfg.src_vocab_size, size=k - 1).tolist(), cfg.eos_id] for k in lengths
    ]


# -- level 3 ---------------------------------------------------------------------------------
def top2(logits: np.ndarray) -> list[list[float]]:
    """[[id, logit], [id, logit]] of the two largest entries of a (V,) vector."""
    order = np.argsort(-logits)[:2]
    return [[int(i), float(logits[i])] for i in order]


def parity_report(
    level1: dict[str, Any],
    level2: dict[str, Any],
    level3: dict[str, Any],
    source_description: str,
    started: float,
) -> dict[str, Any]:
    """The fp32 parity report of three levels (every kind's), timed from `started`."""
    level3["source"] = source_description
    return {
        "variant": "fp32",
        "tolerance": TOLERANCE_FP32,
        "passed": level1["passed"] and level2["passed"] and level3["passed"],
        "level1": level1,
        "level2": level2,
        "level3": level3,
        "seconds": round(time.perf_counter() - started, 2),
    }


def check_parity(report: dict[str, Any]) -> None:
    """Raise `ParityError` (carrying `report`) naming every failed level."""
    if report.get("passed"):
        return
    problems, tol = [], report["tolerance"]
    level1, level2, level3 = report["level1"], report["level2"], report["level3"]
    if not level1["passed"]:
        bad = {k: f"{v:.2e}" for k, v in level1["max_abs_diff"].items() if v > tol}
        problems.append(f"level 1 max |Δ| above {tol:.0e}: {bad}")
    if not level2["passed"]:
        problems.append(
            f"level 2 step logits max |Δ| {level2['max_abs_diff_cached']:.2e} (cached), "
            f"{level2['max_abs_diff_uncached']:.2e} (uncached), bound "
            f"{level2.get('bound', tol):.2e} (tolerance + PyTorch's own cached-vs-uncached "
            "difference)"
        )
    if not level3["passed"]:
        text = f"level 3 {level3['identical']}/{level3['inputs']} greedy sequences identical"
        if level3["mismatches"]:
            m = level3["mismatches"][0]
            text += (
                f"; input #{m['index']} first differs at step {m['step']}: torch top-2 "
                f"{m['torch_top2']}, onnx top-2 {m['onnx_top2']}"
            )
        beam = level3.get("beam", {})
        if beam and not beam["passed"]:
            text += f"; beam {beam['beam_size']}: {beam['identical']}/{beam['inputs']} identical"
        problems.append(text)
    raise ParityError(
        "the exported graphs do not match PyTorch: " + "; ".join(problems), report=report
    )


def parity_group(
    precisions: Sequence[str],
    compare: Callable[[str], dict[str, Any]],
    fp32_passed: Callable[[dict[str, Any]], bool],
    describe: Callable[[str], str],
    progress: Callable[[str], None] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The report group of an extra graph (export/kinds/seq2seq/graph_variants.py): `fields`,
    then `compare(precision)`'s numbers for each of `precisions` (fp32 first; `describe`
    says what is compared, for the progress line), fp32 gated by `fp32_passed`, the others
    reported; `passed` is fp32's, `seconds` the time it took."""
    say = progress or (lambda _: None)
    started = time.perf_counter()
    group: dict[str, Any] = dict(fields)
    for precision in precisions:
        say(describe(precision))
        group[precision] = compare(precision)
    group["fp32"]["passed"] = fp32_passed(group["fp32"])
    group["passed"] = group["fp32"]["passed"]
    group["seconds"] = round(time.perf_counter() - started, 2)
    return group


def add_group(report: dict[str, Any], key: str, group: dict[str, Any]) -> None:
    """Put a group into a parity report under `key`; the report passes only if it does."""
    report[key] = group
    report["passed"] = report["passed"] and group["passed"]


def check_group(report: dict[str, Any], key: str, failure: Callable[[dict[str, Any]], str]) -> None:
    """ParityError (carrying `report`) with `failure(group)`'s message when the report's
    group `key` failed."""
    group = report.get(key)
    if group is not None and not group["passed"]:
        raise ParityError(failure(group), report=report)
