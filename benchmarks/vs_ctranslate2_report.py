"""Markdown tables of `benchmarks/vs_ctranslate2.py`'s report.

    python benchmarks/vs_ctranslate2_report.py vs.json     # the markdown of a saved report

Besides each engine's ratio to CTranslate2 fp32, the tables have the pairings the targets
are stated in (median and range of the per-pass ratios): edgeseq int8 / CTranslate2 int8
and, for greedy, edgeseq fp32 / PyTorch eager.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
from harness import REFERENCE, machine_line, pair_ratio

PAIRS = (
    ("edgeseq int8", "ctranslate2 int8"),
    ("edgeseq int8 loop", "ctranslate2 int8"),
    ("edgeseq int8 graph", "ctranslate2 int8"),
    ("edgeseq fp32", "pytorch eager"),
    ("edgeseq fp32", "edgeseq fp32 logits"),  # the graphs' top-k outputs vs the whole logits
    ("edgeseq int8", "edgeseq int8 logits"),
)


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
    setting = f"{report['threads']} thread(s), {report['passes']} pass(es)"
    if "ct2_cpu_isa" in report["machine"]:  # reports before it: CTranslate2's default
        setting += f", CTranslate2 ISA {report['machine']['ct2_cpu_isa']}"
    lines += ["", machine_line(report["machine"], report["versions"], setting)]
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
