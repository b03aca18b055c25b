"""Markdown tables of `benchmarks/vs_optimum.py`'s report.

    python benchmarks/vs_optimum_report.py vs.json      # the markdown of a saved report

One table of tokens/s per engine and cell (median over passes), the ratios the targets are
stated in (edgeseq fp32 / CTranslate2 fp32, edgeseq fp32 / Optimum, edgeseq int8 /
CTranslate2 int8: median and range of the per-pass ratios), the inputs each engine decoded
to transformers' ids, the memory-bandwidth bound at batch 1, and the machine.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
from harness import machine_line, pair_ratio

PAIRS = (
    ("edgeseq fp32", "ctranslate2 fp32"),
    ("edgeseq fp32", "optimum"),
    ("edgeseq int8", "ctranslate2 int8"),
    ("edgeseq fp32", "transformers eager"),
)


def speed_table(report: dict[str, Any]) -> list[str]:
    """tokens/s per engine (rows) and cell (columns), then the pair ratios."""
    names = list(report["cells"])
    lines = ["| engine | " + " | ".join(names) + " |", "|---|" + "--:|" * len(names)]
    for engine in report["engines"]:
        row = []
        for name in names:
            cell = report["cells"][name].get(engine)
            row.append(f"{np.median(cell['tokens_per_s']):,.0f}" if cell else "")
        lines.append(f"| {engine} | " + " | ".join(row) + " |")
    for engine, other in PAIRS:
        row = [pair_ratio(report["cells"][name], engine, other) for name in names]
        if any(row):
            lines.append(f"| *{engine} / {other}* | " + " | ".join(row) + " |")
    return lines


def identical_table(report: dict[str, Any]) -> list[str]:
    """Inputs whose ids equal transformers', per engine and cell."""
    same = report["identical_to_transformers"]
    names = list(same)
    engines = [e for e in report["engines"] if any(e in same[n] for n in names)]
    lines = [
        "| ids equal to transformers' | " + " | ".join(names) + " |",
        "|---|" + "--:|" * len(names),
    ]
    for engine in engines:
        row = [
            f"{same[n][engine][0]}/{same[n][engine][1]}" if engine in same[n] else "" for n in names
        ]
        lines.append(f"| {engine} | " + " | ".join(row) + " |")
    return lines


def bound_lines(report: dict[str, Any]) -> list[str]:
    """The batch-1 greedy bandwidth bound and each engine's fraction of it."""
    bound = report["bound"]
    params = bound["parameters"]
    lines = [
        f"Bound at batch 1: a greedy step reads {params['decoder layers'] / 1e6:.1f} M decoder "
        f"parameters and a {params['output projection'] / 1e6:.1f} M output projection, "
        f"{bound['fp32_step_bytes'] / 1e6:.0f} MB in fp32; a numpy copy moves "
        f"{bound['copy_bytes_per_s'] / 1e9:.1f} GB/s on one core, so at most "
        f"{bound['fp32_bound_tokens_per_s']:.0f} tokens/s with fp32 weights.",
        "",
        "| engine (greedy, batch 1) | tokens/s | MB read per step | of the fp32 bound "
        "| of its own bound |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, numbers in bound["engines"].items():
        lines.append(
            f"| {name} | {numbers['tokens_per_s']:,.0f} | {numbers['step_bytes'] / 1e6:.0f} | "
            f"{numbers['fraction_of_fp32_bound']:.0%} | {numbers['fraction_of_own_bound']:.0%} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown (module docstring)."""
    config = report["config"]
    lengths = report["greedy_output_lengths"]
    lines = [
        f"Model {report['model']}: d_model {config['d_model']}, {config['encoder_layers']} + "
        f"{config['decoder_layers']} layers, {config['encoder_attention_heads']} heads, FFN "
        f"{config['encoder_ffn_dim']}, vocabulary {config['vocab_size']:,}; {report['sources']}; "
        f"greedy output lengths {lengths['min']}-{lengths['max']} (median {lengths['median']:.0f}, "
        f"{lengths['at_cap']} at the cap of {report['max_new_tokens']}).",
        "",
        f"tokens/s (median of {report['passes']} passes; ratios: median of the per-pass ratios, "
        "lowest-highest in brackets):",
        "",
        *speed_table(report),
        "",
        *identical_table(report),
        "",
        *bound_lines(report),
    ]
    files = ", ".join(f"{name} {mb:,.0f}" for name, mb in report.get("files_mb", {}).items())
    lines += ["", f"MB on disk: {files}."] if files else []
    for name, reason in report["skipped"].items():
        lines += ["", f"{name}: skipped: {reason}"]
    source = report["edgeseq_parity"].get("source")
    if source:
        lines += [
            "",
            f"edgeseq export's parity against MarianMTModel: "
            f"{'passed' if source.get('passed') else 'FAILED'}",
        ]
    cpu = report["machine"]
    setting = f"{cpu['cpus']} CPUs, {report['threads']} thread(s) per engine"
    if "ct2_cpu_isa" in cpu:  # reports before it: CTranslate2's default
        setting += f", CTranslate2 ISA {cpu['ct2_cpu_isa']}"
    lines += [
        "",
        machine_line(cpu, report["versions"], setting)
        + (
            f"; Optimum venv: {', '.join(f'{k} {v}' for k, v in ready['versions'].items())}"
            if (ready := report.get("optimum_ready"))
            else ""
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    (path,) = sys.argv[1:] or [None]
    if path is None:
        sys.exit("usage: python benchmarks/vs_optimum_report.py REPORT.json")
    with open(path, encoding="utf-8") as file:
        print(markdown(json.load(file)))
