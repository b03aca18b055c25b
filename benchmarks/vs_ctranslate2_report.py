"""Machine description and markdown tables of `benchmarks/vs_ctranslate2.py`'s report.

    python benchmarks/vs_ctranslate2_report.py vs.json     # the markdown of a saved report

Besides each engine's ratio to CTranslate2 fp32, the tables have the pairings the targets
are stated in (median and range of the per-pass ratios): edgeseq int8 / CTranslate2 int8
and, for greedy, edgeseq fp32 / PyTorch eager.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

import numpy as np

REFERENCE = "ctranslate2 fp32"  # every ratio is relative to this engine in the same pass
PAIRS = (
    ("edgeseq int8", "ctranslate2 int8"),
    ("edgeseq int8 loop", "ctranslate2 int8"),
    ("edgeseq int8 graph", "ctranslate2 int8"),
    ("edgeseq fp32", "pytorch eager"),
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


def cpu_info() -> dict[str, Any]:
    """CPU model and the SIMD flags int8 kernels depend on (from lscpu, Linux)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return {
        "model": fields.get("Model name", platform.processor()).strip(),
        "flags": [f for f in wanted if f in flags],
        "cpus": os.cpu_count(),
        "loadavg_before": list(os.getloadavg()),
    }


PATTERN_TITLES = {
    "pass": "engines in turn, a whole cell each",
    "batch": "engines alternating batch by batch, random order",
}


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: per alternation pattern, one table per search; the path
    `generate` took per cell, agreement, machine and versions."""
    lines = []
    patterns = report.get("patterns") or {"pass": report["cells"]}
    for pattern, cells in patterns.items():
        if len(patterns) > 1:
            lines += ["", f"### {PATTERN_TITLES.get(pattern, pattern)}"]
        lines += cell_tables(report["engines"], cells)
    paths = report.get("generate_paths") or {}
    if paths:
        lines += ["", "path `generate` took (search auto unless named):"]
        lines += [f"- {key}: {', '.join(taken)}" for key, taken in paths.items()]
    lines += ["", f"greedy ids equal to edgeseq fp32 ({report['sources']}):"]
    for name, a in report["agreement"].items():
        gap = f" (the others are near ties: {a['tie_gap']:.1e} per token)" if "tie_gap" in a else ""
        lines.append(f"- {name}: {a['equal']}/{a['of']}{gap}")
    cpu, versions = report["machine"], report["versions"]
    lines += [
        "",
        f"{cpu['model']} ({', '.join(cpu['flags']) or 'no AVX2'}), {report['threads']} "
        f"thread(s), {report['passes']} pass(es), load average {cpu['loadavg_before'][0]:.2f} "
        f"before and {cpu['loadavg_after'][0]:.2f} after; "
        + ", ".join(f"{k} {v}" for k, v in versions.items()),
    ]
    return "\n".join(lines).lstrip("\n")


def cell_tables(engines: list[str], all_cells: dict[str, Any]) -> list[str]:
    """Markdown lines: one table per search (greedy first), a column per batch size."""
    lines = []
    searches = sorted({key.split(", ")[0] for key in all_cells}, key=lambda s: s != "greedy")
    sizes = list(dict.fromkeys(key.split(", ")[1] for key in all_cells))
    for search_name in searches:
        lines += ["", f"{search_name} (tokens/s relative to {REFERENCE} of the same pass; "
                  "median of passes, lowest-highest pass in brackets):", ""]  # fmt: skip
        lines.append("| engine | " + " | ".join(sizes) + " |")
        lines.append("|---|" + "--:|" * len(sizes))
        cells = [all_cells[f"{search_name}, {s}"] for s in sizes]
        for name in engines:
            if all(name not in cell for cell in cells):
                continue
            row = [
                "" if name not in cell
                else f"{cell[name]['ratio']:.2f}× ({cell[name]['ratio_min']:.2f}–"
                f"{cell[name]['ratio_max']:.2f})"
                for cell in cells
            ]  # fmt: skip
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        for engine, other in PAIRS:
            row = [pair_ratio(cell, engine, other) for cell in cells]
            if any(row):
                lines.append(f"| *{engine} / {other}* | " + " | ".join(row) + " |")
        ref = [cell[REFERENCE]["tokens_per_s"] for cell in cells]
        lines.append(
            f"| ({REFERENCE} tokens/s) | " + " | ".join(f"{np.median(r):,.0f}" for r in ref) + " |"
        )
    return lines


if __name__ == "__main__":
    (path,) = sys.argv[1:] or [None]
    if path is None:
        sys.exit("usage: python benchmarks/vs_ctranslate2_report.py REPORT.json")
    with open(path, encoding="utf-8") as file:
        print(markdown(json.load(file)))
