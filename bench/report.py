"""The report of `edgeseq bench`: a Markdown table with its footnotes, and a bar chart.

print(markdown_report(report))      # report: bench.compare.run_benchmark's result
plot_report(report, "bench.png")    # needs matplotlib
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeseq.runtime.errors import MissingDependencyError

from .graph_worker import graph_lines


def _number(value: float | None, digits: int = 1) -> str:
    """1234.5 -> "1,234.5"; None -> "—"."""
    return "—" if value is None else f"{value:,.{digits}f}"


def markdown_report(report: dict[str, Any]) -> str:
    """The benchmark as Markdown: settings, one table row per engine and batch size, notes."""
    s, m = report["settings"], report["machine"]
    load = f"{m['loadavg_before'][0]:.2f} → {m['loadavg_after'][0]:.2f}"
    lines = [
        f"## edgeseq bench: {report['bundle']}",
        "",
        f"- search: {s['search']}, max_new_tokens {s['max_new_tokens'] or 'max_len'}, "
        f"{s['threads']} thread(s), provider {s['provider']}, "
        f"onnxruntime graph optimization {s['optimization']}",
        f"- inputs: {s['inputs']} from {s['inputs_from']}; {s['repeats']} timed pass(es) per "
        f"batch size and round (median), after {'one warm-up pass' if s['warmup'] else 'none'}"
        f"; {s['rounds']} round(s) of every engine",
        f"- machine: {m['cpu_count']} CPUs ({m['processor']}), 1-min load average {load}",
        "",
        "| engine | batch | tokens/s | × PyTorch | seq p50 ms | seq p90 ms | ms/token "
        "| load s | files MB | peak RSS MB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    batches = sorted({int(b) for e in report["engines"] for b in e["batches"]})
    for batch in batches:
        for engine in report["engines"]:
            stats = engine["batches"].get(str(batch))
            if stats is None:
                continue
            ratio = report["ratios"].get(engine["variant"] or "", {}).get(str(batch))
            cells = [
                engine["engine"],
                str(batch),
                _number(stats["tokens_per_s"]),
                f"{ratio['tokens_per_s']:.2f}×" if ratio else "—",
                _number(stats["seq_ms_p50"], 2),
                _number(stats["seq_ms_p90"], 2),
                _number(stats["token_ms_p50"], 3),
                _number(engine["load_s"], 3),
                _number(engine["file_bytes"] / 1e6),
                _number(engine["peak_rss_mb"], 0),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *graph_lines(report), *notes(report)]
    return "\n".join(lines).rstrip() + "\n"


def notes(report: dict[str, Any]) -> list[str]:
    """Footnotes: what the columns mean, skipped variants, engines that did different work."""
    out = [
        "tokens/s: generated tokens (best hypothesis, `</s>` included) / time, median of the "
        "passes. seq: time of the batch an input was in. ms/token: batch time / decoder steps.",
        "load s: session creation (onnxruntime) or checkpoint load (PyTorch). peak RSS: the "
        "measuring process (each engine in its own; onnxruntime processes cannot import torch).",
    ]
    for engine in report["engines"]:
        if engine["kind"] == "pytorch" and engine.get("source", "checkpoint") != "checkpoint":
            out.append(
                f"pytorch eager: edgeseq's PyTorch module holding the weights of "
                f"{engine['source_description']}, with its KV cache (not the source's own code)"
            )
    for skip in report["skipped"]:
        out.append(f"skipped variant {skip['variant']}: {skip['reason']}")
    for variant, per_batch in report["ratios"].items():
        differ = [b for b, r in per_batch.items() if not r["same_tokens"]]
        if differ:
            out.append(
                f"note: onnxruntime {variant} and PyTorch generated different numbers of tokens "
                f"at batch {', '.join(differ)} (expected for int8/fp16; a bug for fp32)"
            )
    return ["- " + note for note in out]


def plot_report(report: dict[str, Any], path: str | Path) -> None:
    """A bar chart of tokens/s per engine, one panel per batch size, written to `path` (PNG).
    Needs matplotlib (MissingDependencyError without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ModuleNotFoundError:
        raise MissingDependencyError(
            "--plot needs matplotlib: pip install matplotlib (or 'edgeseq[train]')"
        ) from None
    batches = sorted({int(b) for e in report["engines"] for b in e["batches"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches) + 1, 3.6), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        runs = [e for e in report["engines"] if str(batch) in e["batches"]]
        values = [e["batches"][str(batch)]["tokens_per_s"] for e in runs]
        bars = ax.bar(range(len(runs)), values, color=[_color(e) for e in runs])
        for bar, engine in zip(bars, runs, strict=True):
            ratio = report["ratios"].get(engine["variant"] or "", {}).get(str(batch))
            label = f"{ratio['tokens_per_s']:.2f}×" if ratio else ""
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=9)  # fmt: skip
        ax.set_xticks(range(len(runs)), [_short_name(e) for e in runs])
        ax.margins(y=0.12)  # room for the ratio labels
        ax.set_title(f"batch {batch}")
        ax.set_ylabel("generated tokens / s")
    s = report["settings"]
    name = "/".join(Path(report["bundle"]).parts[-2:])
    fig.suptitle(f"{name}: {s['search']}, {s['threads']} thread(s), tokens/s ORT ÷ PyTorch")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _short_name(engine: dict[str, Any]) -> str:
    """ "PyTorch\neager" or "ORT\nint8": fits under a bar."""
    return "PyTorch\neager" if engine["kind"] == "pytorch" else f"ORT\n{engine['variant']}"


def _color(engine: dict[str, Any]) -> str:
    """Bar colour: PyTorch orange, onnxruntime blue."""
    return "tab:orange" if engine["kind"] == "pytorch" else "tab:blue"
