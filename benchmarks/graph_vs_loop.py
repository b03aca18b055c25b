"""The one-graph search against the loop, per cell: the measurement behind search "auto".

    python benchmarks/graph_vs_loop.py models/g2p-en --bundle /tmp/g2p-s --words 32 --passes 2
    python benchmarks/graph_vs_loop.py benchmarks/random-d512.json --bundle /tmp/d512-s

MODEL is a checkpoint directory or a `ModelConfig` JSON file for a random-weight model (seed
0), as in vs_ctranslate2.py, whose source choice (`task_sources`) this script shares. The
bundle at `--bundle` is used when it exists, else exported there with `--variants
fp32,int8,search,inplace` (no parity run). Per precision (`--precisions`), two engines run
`Generator.generate` on the same texts: search "graph" (the `BeamSearch` node) and search
"loop" (the Python loop; beam search on the in-place cache decoder when the bundle has it).
Cells are (beam, batch size); in each pass every cell runs both engines in an order that
alternates per pass and per cell (`harness.measure`'s "pass" pattern). Prints, per cell and
precision, the median tokens/s of each and the graph / loop ratio per pass.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import add_cell_options, cell_name, cpu_info, cut, positive_int, say
from vs_ctranslate2 import random_model, task_sources
from vs_ctranslate2_engines import GenerateEngine


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see --help)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path, help="checkpoint directory or ModelConfig JSON file")
    parser.add_argument("--bundle", type=Path, required=True, help="bundle (exported if absent)")
    parser.add_argument("--words", type=positive_int, default=32, help="sources (default 32)")
    parser.add_argument("--precisions", default="fp32,int8", help="default fp32,int8")
    add_cell_options(parser)
    return parser.parse_args(argv)


def load_model(path: Path) -> tuple[Any, Any, dict | None]:
    """(model, tokenizers, task) of a checkpoint directory or a random-weight config."""
    if path.is_dir():
        from edgeseq.build_model.checkpoint import load_checkpoint

        model, tokenizers, meta = load_checkpoint(path)
        return model, tokenizers, meta.task
    return (*random_model(path), None)


def time_cell(engines: list, batches: list, beam: int, index: int) -> dict[str, float]:
    """One pass of one cell: tokens/s per engine, engines in an order rotated by `index`."""
    shift = index % len(engines)
    rates = {}
    for engine in engines[shift:] + engines[:shift]:
        start = time.perf_counter()
        _, tokens = engine.run(batches, beam)
        rates[engine.name] = tokens / (time.perf_counter() - start)
    return rates


def main(argv: Sequence[str] | None = None) -> int:
    """Export if needed, time every cell, print the table."""
    args = parse_args(argv)
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle
    from edgeseq.export.variants import VariantOptions
    from edgeseq.runtime.generator import Generator

    model, tokenizers, task = load_model(args.model)
    if not args.bundle.exists():
        say(f"exporting {args.bundle} (fp32, int8, search, inplace)")
        variants = VariantOptions(names=("fp32", "int8", "search", "inplace"))
        export_bundle(model, tokenizers, args.bundle, task=task, verify=False, variants=variants)
    sources, described = task_sources(model, tokenizers, task, args.words)
    precisions = [p for p in args.precisions.split(",") if p]
    engines = {
        p: [
            GenerateEngine(
                f"{p} {mode}",
                Generator.load(args.bundle, "cpu", args.threads, p, search=mode),
                sources,
            )
            for mode in ("graph", "loop")
        ]
        for p in precisions
    }
    cells = [(beam, size) for beam in args.beams for size in args.batch_sizes]
    for beam, size in cells:  # untimed warm-up
        for pair in engines.values():
            for engine in pair:
                engine.run(cut(sources, size)[:2], beam)
    rates: dict[tuple, dict[str, list[float]]] = {}
    for index in range(args.passes):
        for position, (beam, size) in enumerate(cells):
            batches = cut(sources, size)
            for pair in engines.values():
                for name, rate in time_cell(pair, batches, beam, index + position).items():
                    rates.setdefault((beam, size), {}).setdefault(name, []).append(rate)
            say(f"pass {index + 1}/{args.passes}: beam {beam}, batch {size}")
    machine = cpu_info()
    print(f"{args.model}: {described}; {args.threads} thread(s), {args.passes} passes; {machine}")
    print("| cell | precision | graph tok/s | loop tok/s | graph / loop (per pass) |")
    print("|---|---|--:|--:|---|")
    for (beam, size), by_name in rates.items():
        for p in precisions:
            graph, loop = by_name[f"{p} graph"], by_name[f"{p} loop"]
            ratios = [g / v for g, v in zip(graph, loop, strict=True)]
            per_pass = ", ".join(f"{r:.2f}" for r in ratios)
            print(
                f"| {cell_name(beam, size)} | {p} | {statistics.median(graph):.0f} | "
                f"{statistics.median(loop):.0f} | {statistics.median(ratios):.2f}× ({per_pass}) |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
