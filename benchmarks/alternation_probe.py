"""How much edgeseq loses when another workload runs between its batches, in one process.

    python benchmarks/alternation_probe.py BUNDLE --other ct2 --path loop --rounds 6
    python benchmarks/alternation_probe.py BUNDLE --other sweep      # data caches only

BUNDLE is a g2p-en export (`--path graph` needs its search variant). Each round decodes the
task's first `--words` test words in batches of `--batch-size`, four ways: alone (batch
after batch) and alternating with `--other` after each batch, each with Python's garbage
collector on and off; the order of the four is reversed every other round. Printed: the
median seconds of edgeseq's own calls per way, and alone / alternating (1.0: no loss).
Others: `ct2` (CTranslate2 fp32 on the same weights: needs `--checkpoint` and the bench
extra), `sweep` (a sum over 64 MB: evicts the data caches), `python` (JSON, Decimal and
regex work: the interpreter busy with other code), `sleep` (20 ms idle).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import numpy as np

from edgeseq.runtime.generator import Generator
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import GenerationOptions, search


def other_workload(name: str, args: argparse.Namespace, gen: Generator) -> Callable:
    """The work run between edgeseq's batches: batch (int64 (B, S)) -> None."""
    if name == "sweep":
        block = np.ones(64 * 2**20 // 8)
        return lambda batch: block.sum()
    if name == "python":
        blob = {f"k{i}": [i, str(i), {"x": i * 1.5}] for i in range(3000)}

        def python(batch: np.ndarray) -> None:
            json.loads(json.dumps(blob))
            sum(Decimal(i) / 7 for i in range(2000))
            re.findall(r"k(\d+)", str(list(blob)[:2000]))

        return python
    if name == "sleep":
        return lambda batch: time.sleep(0.02)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ctranslate2
    from ct2_convert import convert_to_ctranslate2, ct2_vocabulary

    from edgeseq.build_model.checkpoint import load_checkpoint

    model, _, _ = load_checkpoint(args.checkpoint)
    path = convert_to_ctranslate2(model, Path(tempfile.mkdtemp(prefix="edgeseq-alt-")) / "ct2")
    translator = ctranslate2.Translator(str(path), compute_type="float32", intra_threads=1)
    vocabulary, cfg = ct2_vocabulary(gen.config.src_vocab_size), gen.config

    def ct2(batch: np.ndarray) -> None:
        tokens = [[vocabulary[i] for i in row if i != cfg.pad_id] for row in batch]
        translator.translate_batch(tokens, beam_size=args.beam, max_decoding_length=cfg.max_len)

    return ct2


def main() -> None:
    """Parse the command line, run the rounds, print the medians."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bundle")
    parser.add_argument("--other", choices=("ct2", "sweep", "python", "sleep"), default="ct2")
    parser.add_argument("--path", choices=("loop", "graph"), default="loop")
    parser.add_argument("--checkpoint", default="models/g2p-en", help="for --other ct2")
    parser.add_argument("--words", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    from edgeseq.build_model.tasks import load_task

    gen = Generator.load(args.bundle, "cpu", 1, "fp32", search=args.path)
    if args.path == "graph" and gen.graph_search is None:
        sys.exit(
            f"error: {args.bundle} has no search variant; export it with --variants fp32,search"
        )
    texts = list(dict.fromkeys(text for text, _ in load_task("g2p").split("test")))[: args.words]
    sources = sorted((gen.encode(t).ids for t in texts), key=len)
    size, pad = args.batch_size, gen.config.pad_id
    batches = [right_pad(sources[i : i + size], pad) for i in range(0, len(sources), size)]
    options = GenerationOptions(beam_size=args.beam)
    if args.path == "graph":
        ours: Callable = lambda batch: gen.graph_search.search(batch, options)  # noqa: E731
    else:
        ours = lambda batch: search(gen.step_model, batch, options)  # noqa: E731
    theirs = other_workload(args.other, args, gen)
    for batch in batches[:4]:  # warm-up
        ours(batch), theirs(batch)

    def run(way: str) -> float:
        if "no gc" in way:
            gc.collect()
            gc.disable()
        spent = 0.0
        for batch in batches:
            start = time.perf_counter()
            ours(batch)
            spent += time.perf_counter() - start
            if way.startswith("alternating"):
                theirs(batch)
        gc.enable()
        return spent

    ways = ("alone", "alternating", "alone, no gc", "alternating, no gc")
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    for index in range(args.rounds):
        for way in ways if index % 2 == 0 else ways[::-1]:
            seconds[way].append(run(way))
    median = {way: float(np.median(values)) for way, values in seconds.items()}
    print(", ".join(f"{way} {value:.3f} s" for way, value in median.items()))
    print(
        f"{args.path} vs {args.other}, beam {args.beam}, batch {size}: alone / alternating "
        f"{median['alone'] / median['alternating']:.3f} (gc on), "
        f"{median['alone, no gc'] / median['alternating, no gc']:.3f} (gc off)"
    )


if __name__ == "__main__":
    main()
