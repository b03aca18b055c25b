"""The harness `vs_ctranslate2.py` and `vs_optimum.py` share: interleaved timing of engines,
their common options, CTranslate2's decode loop and the pieces of their reports.

    from harness import cut, measure
    cells = measure(engines, sources, batch_sizes=(1, 32), beams=(1, 4), passes=3)
    cells["beam 4, batch 32"]["edgeseq int8"]["ratio"]   # median tokens/s ratio to REFERENCE

An engine has a `name` and `run(batches, beam) -> (outputs, tokens)`: the ids generated for
every source (no `<s>`, no `</s>`) in batch order, and the tokens counted for tokens/s (ids
plus one for `</s>` when the output ended before the cap). An engine with
`greedy_only = True` is left out of beam cells. Sources are lists of ids, sorted by length
and cut into batches of each batch size (`cut`), the same batches for every engine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REFERENCE = "ctranslate2 fp32"  # every ratio is relative to this engine in the same pass
PATTERNS = ("pass", "batch")  # how engines alternate (`measure`)
Outputs = list[tuple[int, ...]]  # generated ids (no <s>, no </s>) per source, in batch order


def cut(sources: Sequence[list[int]], size: int) -> list[list[list[int]]]:
    """Sources sorted by length (stable), in batches of `size`."""
    ordered = sorted(sources, key=len)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def cell_name(beam: int, size: int) -> str:
    """A cell's key in the reports: "greedy, batch 1", "beam 4, batch 32"."""
    return f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {size}"


def measure(
    engines: Sequence[Any],
    sources: Sequence[list[int]],
    batch_sizes: Sequence[int],
    beams: Sequence[int],
    passes: int,
    pattern: str = "pass",
    reference: str = REFERENCE,
) -> dict[str, Any]:
    """Interleaved passes -> per cell, per engine: tokens/s of every pass and the per-pass
    ratios to the engine named `reference` (median, lowest, highest). After an untimed
    warm-up (the first two batches of each cell), each pass runs every cell (search x batch
    size) once per engine.
    `pattern` "pass": each engine decodes all of a cell's batches in turn, in an order rotated
    by one engine per pass and per cell, so a load that changes during the run (a shared
    machine) favours no engine; "batch": the engines take turns batch by batch, in a random
    order per batch (seeded), each engine's time summed over its batches."""
    cells = [(beam, size) for beam in beams for size in batch_sizes]
    rates: dict[tuple, dict[str, list[float]]] = {cell: {} for cell in cells}
    rng = np.random.default_rng(0)
    for beam, size in cells:
        for engine in runs_beam(engines, beam):
            engine.run(cut(sources, size)[:2], beam)
    for index in range(passes):
        for position, (beam, size) in enumerate(cells):
            batches = cut(sources, size)
            here = runs_beam(engines, beam)
            seconds = dict.fromkeys((e.name for e in here), 0.0)
            tokens = dict.fromkeys(seconds, 0)
            if pattern == "pass":
                shift = (index + position) % len(here)
                turns = [(engine, batches) for engine in here[shift:] + here[:shift]]
            else:
                turns = [(here[i], [b]) for b in batches for i in rng.permutation(len(here))]
            for engine, work in turns:
                start = time.perf_counter()
                _, count = engine.run(work, beam)
                seconds[engine.name] += time.perf_counter() - start
                tokens[engine.name] += count
            for name, spent in seconds.items():
                rates[beam, size].setdefault(name, []).append(tokens[name] / spent)
            say(f"{pattern} pattern, pass {index + 1}/{passes}: beam {beam}, batch {size}")
    out: dict[str, Any] = {}
    for (beam, size), by_engine in rates.items():
        base = by_engine[reference]
        cell = {}
        for name, values in by_engine.items():
            ratio = [v / r for v, r in zip(values, base, strict=True)]
            cell[name] = {
                "tokens_per_s": values,
                "ratio_per_pass": ratio,
                "ratio": float(np.median(ratio)),
                "ratio_min": min(ratio),
                "ratio_max": max(ratio),
            }
        out[cell_name(beam, size)] = cell
    return out


def runs_beam(engines: Sequence[Any], beam: int) -> list[Any]:
    """The engines that run cells of `beam` (greedy: all; beam: not the greedy-only ones)."""
    return [e for e in engines if beam == 1 or not getattr(e, "greedy_only", False)]


def translate_batches(
    translator: Any,
    batches: Sequence[Sequence[list[int]]],
    beam: int,
    max_len: int,
    source_token: Sequence[str] | Mapping[int, str],
    target_id: Mapping[str, int],
) -> tuple[Outputs, int]:
    """CTranslate2 `Translator.translate_batch` over every batch of source ids (mapped to its
    tokens by `source_token`) -> the best hypothesis' ids (`target_id`) per source and the
    tokens counted: ids plus one for `</s>` when it stopped before `max_len`."""
    outputs, tokens = [], 0
    for batch in batches:
        results = translator.translate_batch(
            [[source_token[i] for i in ids] for ids in batch],
            beam_size=beam,
            max_decoding_length=max_len,
        )
        for result in results:
            ids = tuple(target_id[t] for t in result.hypotheses[0])
            outputs.append(ids)
            tokens += len(ids) + (len(ids) < max_len)
    return outputs, tokens


# -- the command line -------------------------------------------------------------------------
def positive_int(text: str) -> int:
    """argparse type: a positive integer."""
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated positive integers ("1,32")."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,32, got {text!r}")
    return values


def add_cell_options(parser: argparse.ArgumentParser) -> None:
    """--passes, --batch-sizes, --beams and --threads, with the defaults both scripts use."""
    parser.add_argument(
        "--passes",
        type=positive_int,
        default=3,
        help="timed passes over every cell (default 3; 5 for published numbers)",
    )
    parser.add_argument(
        "--batch-sizes",
        type=int_list,
        default=(1, 32),
        help="comma-separated batch sizes (default 1,32)",
    )
    parser.add_argument(
        "--beams", type=int_list, default=(1, 4), help="beam sizes, 1 = greedy (default 1,4)"
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="intra-op threads per engine (default 1)"
    )


# -- the report -------------------------------------------------------------------------------
def cpu_info() -> dict[str, Any]:
    """CPU model (from lscpu, Linux) and the SIMD flags int8 kernels depend on (the runtime's
    own reading of them, runtime/cpu_features.py)."""
    from edgeseq.runtime.cpu_features import cpu_flags

    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = cpu_flags() or frozenset()
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return {
        "model": fields.get("Model name", platform.processor()).strip(),
        "flags": [f for f in wanted if f in flags],
        "cpus": os.cpu_count(),
        "loadavg_before": list(os.getloadavg()),
    }


def ct2_best_isa() -> dict[str, str]:
    """The environment that gives CTranslate2 its best setting on this CPU:
    CT2_FORCE_CPU_ISA=AVX512 where the CPU has AVX-512 (CTranslate2 4.8 does not choose it by
    itself on AMD EPYC CPUs, and it was 10-30% faster at batch 32 with it there); nothing
    where it has not, or when the variable is already set."""
    if "CT2_FORCE_CPU_ISA" in os.environ or "avx512f" not in cpu_info()["flags"]:
        return {}
    return {"CT2_FORCE_CPU_ISA": "AVX512"}


def versions(modules: Sequence[str]) -> dict[str, str]:
    """edgeseq's version, then each of `modules`' `__version__` in order, then Python's."""
    from edgeseq.export.onnx_export import edgeseq_version

    found = {name: importlib.import_module(name).__version__ for name in modules}
    return {"edgeseq": edgeseq_version(), **found, "python": platform.python_version()}


def machine_line(machine: dict[str, Any], versions: dict[str, str], setting: str) -> str:
    """The report's last line: CPU, flags, `setting` (threads, passes), load, versions."""
    return (
        f"{machine['model']} ({', '.join(machine['flags']) or 'no AVX2'}), {setting}, load "
        f"average {machine['loadavg_before'][0]:.2f} before and "
        f"{machine['loadavg_after'][0]:.2f} after; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
    )


def pair_ratio(cell: dict[str, Any], engine: str, other: str) -> str:
    """`engine` / `other` tokens/s per pass: "median× (lowest–highest)", or "" if absent."""
    if engine not in cell or other not in cell:
        return ""
    ratio = [
        a / b
        for a, b in zip(cell[engine]["tokens_per_s"], cell[other]["tokens_per_s"], strict=True)
    ]
    return f"{np.median(ratio):.2f}× ({min(ratio):.2f}–{max(ratio):.2f})"


def emit_report(report: dict[str, Any], json_path: Path | None, text: str) -> None:
    """Print the report's markdown `text`; write every number to `json_path` when given
    (indented, sorted keys)."""
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(text)


def say(message: str) -> None:
    """Progress on stderr (stdout carries the report)."""
    print(message, file=sys.stderr, flush=True)
