"""Two exports of the same model through `Generator.generate`, alternating in one process:
how much faster is B than A, and are its ids A's?

    python benchmarks/bundle_ab.py OLD_BUNDLE NEW_BUNDLE --input heldout.txt --variant int8
    python benchmarks/bundle_ab.py A B --input texts.txt --cells 4x32,4x1,1x32 --rounds 3

Both bundles are loaded with 1 intra-op thread (`--threads`) and the `--variant` graphs. Each
cell (`--cells`: BEAMxBATCH, beam 1 = greedy) decodes the first `--inputs` lines of
`--input` (batch 1 cells the first 16) with edgeseq's default options (`.filled()`, as
`vs_optimum.py` runs them) and a cap of `--max-new-tokens`. In each round every cell runs A
and B once, the order swapped every round. Prints per cell the fastest round of each, B's
speed over A's from those, the per-round ratios, and how many inputs got the same ids.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from edgeseq.runtime import Generator
from edgeseq.runtime.search import GenerationOptions

SINGLE_INPUTS = 16  # inputs decoded by a batch-1 cell


def parse_cells(text: str) -> list[tuple[int, int]]:
    """ "4x32,1x32" -> [(4, 32), (1, 32)]: (beam size, batch size) per cell."""
    cells = []
    for item in text.split(","):
        beam, _, batch = item.partition("x")
        if not (beam.isdigit() and batch.isdigit() and int(beam) > 0 and int(batch) > 0):
            raise argparse.ArgumentTypeError(f"a cell is BEAMxBATCH, e.g. 4x32; got {item!r}")
        cells.append((int(beam), int(batch)))
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rounds; print one line per cell. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="the reference bundle")
    parser.add_argument("b", type=Path, help="the bundle compared with it")
    parser.add_argument("--input", type=Path, required=True, help="source texts, one per line")
    parser.add_argument("--variant", default="fp32", help="graphs of both bundles (fp32, int8)")
    parser.add_argument("--cells", type=parse_cells, default=parse_cells("4x32,4x1,1x32"))
    parser.add_argument("--inputs", type=int, default=64, help="lines decoded per cell (64)")
    parser.add_argument("--rounds", type=int, default=3, help="(3)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="(96)")
    args = parser.parse_args(argv)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    texts = [line for line in lines if line.strip()][: args.inputs]
    generators = {
        name: Generator.load(path, threads=args.threads, variant=args.variant)
        for name, path in (("A", args.a), ("B", args.b))
    }
    seconds: dict[tuple[int, int, str], list[float]] = {}
    ids: dict[tuple[int, int, str], list[list[int]]] = {}
    for round_ in range(args.rounds):
        for beam, batch in args.cells:
            options = GenerationOptions(
                beam_size=beam, batch_size=batch, max_new_tokens=args.max_new_tokens
            ).filled()
            sources = texts if batch > 1 else texts[:SINGLE_INPUTS]
            for name in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
                start = time.perf_counter()
                results = generators[name].generate(sources, options)
                seconds.setdefault((beam, batch, name), []).append(time.perf_counter() - start)
                ids[beam, batch, name] = [result.token_ids for result in results]
    print(f"{args.a} (A) against {args.b} (B), {args.variant}, {args.rounds} rounds")
    for beam, batch in args.cells:
        a, b = seconds[beam, batch, "A"], seconds[beam, batch, "B"]
        pairs = zip(ids[beam, batch, "A"], ids[beam, batch, "B"], strict=True)
        same = sum(x == y for x, y in pairs)
        search = "greedy" if beam == 1 else f"beam {beam}"
        rounds = ", ".join(f"{x / y:.2f}" for x, y in zip(a, b, strict=True))
        print(
            f"{search}, batch {batch}: A {min(a):.2f} s, B {min(b):.2f} s, B's speed "
            f"{min(a) / min(b):.2f}x A's (rounds: {rounds}); same ids "
            f"{same}/{len(ids[beam, batch, 'A'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
