"""Beam (and greedy) search on a bundle's in-place cache decoder against the copying loop on
`decoder.onnx`: the same `runtime.search` over both step models, same batches, CPU time.

    edgeseq export models/g2p-en --out /tmp/g2p-ip --variants fp32,int8,inplace
    python benchmarks/in_place_vs_copy.py /tmp/g2p-ip --inputs 256 --rounds 2

The bundle needs `--variants ...,inplace`. Sources are random source-vocabulary ids of 2 to
14 tokens (seed 0). Prints, per search and batch size, both CPU times (the sum over the
rounds after an untimed warm-up, the two engines alternating batch by batch), their ratio
(copy / in place: above 1, in place is faster), and whether every hypothesis has the same
ids. 1 thread.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgeseq.runtime import Generator
from edgeseq.runtime import constants as C
from edgeseq.runtime.errors import EdgeseqError
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import GenerationOptions, search


def main() -> None:
    """Parse the command line, time both step models, print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="a bundle exported with --variants ...,inplace")
    parser.add_argument("--variant", default="fp32", help="fp32 or int8 (default fp32)")
    parser.add_argument("--inputs", type=int, default=256, help="random sources (default 256)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (default 2)")
    parser.add_argument("--batch-sizes", default="1,32", help="default 1,32")
    args = parser.parse_args()
    gen = Generator.load(args.bundle, "cpu", 1, args.variant, search="loop")
    if gen.in_place is None:
        raise SystemExit(f"{args.bundle} has no in-place decoder for {args.variant}")
    copy, in_place, cfg = gen.step_model, gen.in_place, gen.config
    rng = np.random.default_rng(0)
    low = len(C.SPECIAL_TOKENS)
    sources = [
        [*rng.integers(low, cfg.src_vocab_size, int(n)).tolist(), cfg.eos_id]
        for n in rng.integers(2, 15, args.inputs)
    ]
    sources.sort(key=len)
    print("| search | batch | copy CPU s | in place CPU s | copy / in place | same ids |")
    print("|---|--:|--:|--:|--:|---|")
    for beam in (1, 4):
        options = GenerationOptions(beam_size=beam, n_best=beam)
        for size in (int(s) for s in args.batch_sizes.split(",")):
            batches = [right_pad(sources[i : i + size], cfg.pad_id)
                       for i in range(0, len(sources), size)]  # fmt: skip
            seconds, same = {"copy": 0.0, "in place": 0.0}, True
            for round_ in range(args.rounds + 1):
                for batch in batches:
                    out = {}
                    for name, model in (("copy", copy), ("in place", in_place)):
                        start = time.process_time()
                        out[name] = search(model, batch, options)
                        if round_:  # round 0 warms up
                            seconds[name] += time.process_time() - start
                    same &= all(
                        [h.tokens for h in a] == [h.tokens for h in b]
                        for a, b in zip(out["copy"], out["in place"], strict=True)
                    )
            ratio = seconds["copy"] / seconds["in place"]
            name = "greedy" if beam == 1 else f"beam {beam}"
            print(f"| {name} | {size} | {seconds['copy']:.2f} | {seconds['in place']:.2f} | "
                  f"{ratio:.2f}× | {'yes' if same else 'no'} |")  # fmt: skip


if __name__ == "__main__":
    try:
        main()
    except EdgeseqError as exc:
        raise SystemExit(f"error: {exc}") from None
