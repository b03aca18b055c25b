"""edgeseq on CUDA against the model's own PyTorch code on CUDA, on the same Marian weights.

    python benchmarks/vs_torch_cuda.py runs/cuda --inputs 128 --passes 2 --json cuda.json
    python benchmarks/vs_torch_cuda.py /tmp/cuda-tiny --tiny --provider cpu --inputs 8 \\
        --batch-sizes 1,4 --passes 1            # the same run on the CPU: a dry run, minutes

WORK keeps what the run builds, each step skipped when its result is already there (as in
`vs_optimum.py`): WORK/marian, the opus-mt-sized MarianMT checkpoint of `marian_opus.py`
(random weights; `--tiny` a d_model 32 one; `--model DIR` uses yours), and WORK/bundle,
`edgeseq export WORK/marian --variants fp32,fp16,search --data WORK/heldout.txt` (the export
docs/gpu.md gives for a GPU; `--variants` changes it), with its parity checks and gates
(`--no-verify` skips them, as `--tiny` does).

Engines, in one process, on `--provider` (default cuda), every one starting from Marian's ids:
transformers `MarianMTModel.generate` in float32 and in float16 (`model.to(dtype)`), and
edgeseq `Generator.load(bundle, providers=..., variant=...)` of fp32 and of fp16 with default
options (search "auto": on CUDA the one-graph search where the bundle has it). The search is
`vs_optimum.py`'s: greedy or beam 4, length penalty 1, early stopping, no `</s>` forced at the
cap, at most `--max-new-tokens`; inputs sorted by length and cut into batches of 1, 32 and
128 (`--batch-sizes`). Timing is `harness.measure`: engines interleaved, each pass rotating
their order; a ratio is tokens/s over transformers float32's of the same pass, median over
passes. Every engine's ids are compared with transformers float32's of the same cell.

GPU memory: afterwards each engine runs the largest batch size, greedy and beam 4, once more
in a process of its own (`--worker`), which reports the most memory the process held on the
GPU (`nvidia-smi --query-compute-apps`, sampled every 20 ms; the CUDA context included, the
same for every engine) and, for PyTorch, `torch.cuda.max_memory_reserved`. On the CPU
provider it reports the peak RSS instead. `--no-memory` skips it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import (  # noqa: E402
    add_cell_options,
    cut,
    emit_report,
    measure,
    positive_int,
    say,
    versions,
)
from vs_optimum import identical, prepare_bundle, prepare_model, source_ids  # noqa: E402
from vs_optimum_engines import EdgeseqEngine, Engine, TransformersEngine  # noqa: E402

REFERENCE = "transformers fp32"  # every ratio and id comparison is against this engine
ENGINES = ("transformers fp32", "transformers fp16", "edgeseq fp32", "edgeseq fp16")


def make_engine(name: str, args: argparse.Namespace, marian: Path, bundle: Path, texts: dict):
    """The engine called `name` (one of ENGINES) on args.provider."""
    vocab = json.loads((marian / "vocab.json").read_text(encoding="utf-8"))
    library, precision = name.split()
    if library == "transformers":
        dtype = {"fp32": "float32", "fp16": "float16"}[precision]
        device = "cuda" if args.provider == "cuda" else "cpu"
        return TransformersEngine(marian, vocab["<pad>"], args.max_new_tokens, device, dtype, name)
    return EdgeseqEngine(
        precision, bundle, args.threads, texts, args.max_new_tokens, args.provider, name
    )


# -- GPU memory, one engine per process ----------------------------------------------------------
class GpuMemory:
    """Samples this process's GPU memory (MiB) with nvidia-smi in a thread; `peak` is the
    highest sample (None when nvidia-smi is absent or never listed the process)."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.peak: int | None = None
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        command = ["nvidia-smi", "--query-compute-apps=pid,used_memory"]
        command.append("--format=csv,noheader,nounits")
        while not self._stop.is_set():
            try:
                text = subprocess.run(command, capture_output=True, text=True).stdout
            except OSError:
                return
            for line in text.splitlines():
                pid, _, used = line.partition(",")
                if pid.strip() == str(os.getpid()) and used.strip().isdigit():
                    self.peak = max(self.peak or 0, int(used))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GpuMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(args: argparse.Namespace) -> None:
    """--worker ENGINE: load it, decode the largest batch size greedy and beam 4, print one
    JSON line of its memory."""
    marian, bundle = args.model or args.work / "marian", args.work / "bundle"
    texts = (args.work / "inputs.txt").read_text(encoding="utf-8").splitlines()
    sources, text_of, _ = source_ids(marian, texts, bundle)
    size = max(args.batch_sizes)
    with GpuMemory() as gpu:
        engine = make_engine(args.worker, args, marian, bundle, text_of)
        for beam in args.beams:
            engine.run(cut(sources, size), beam)
        if args.provider == "cuda":
            import torch

            torch.cuda.synchronize()
        time.sleep(0.1)  # one more sample after the last batch
    result: dict[str, Any] = {"engine": args.worker, "batch_size": size, "gpu_mib": gpu.peak}
    if args.worker.startswith("transformers") and args.provider == "cuda":
        import torch

        result["torch_max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    result["peak_rss_mib"] = peak_rss_mb()
    print(json.dumps(result), flush=True)


def memory(args: argparse.Namespace, engines: Sequence[str]) -> dict[str, Any]:
    """Each engine's `worker` process -> its memory report (or the error it ended with)."""
    out = {}
    for name in engines:
        command = [sys.executable, __file__, str(args.work), "--worker", name]
        command += ["--provider", args.provider, "--threads", str(args.threads)]
        command += ["--max-new-tokens", str(args.max_new_tokens)]
        command += ["--batch-sizes", str(max(args.batch_sizes))]
        command += ["--beams", ",".join(map(str, args.beams))]
        command += ["--model", str(args.model)] if args.model else []
        say(f"memory: {name}")
        done = subprocess.run(command, capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            out[name] = json.loads(lines[-1])
        else:
            out[name] = {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return out


# -- the report ---------------------------------------------------------------------------------
def report_text(report: dict[str, Any]) -> str:
    """Markdown: tokens/s per engine and cell with the ratio to transformers fp32 and the ids
    equal to its ids, then memory."""
    engines = report["engines"]
    lines = [
        f"tokens/s on {report['device']} (ratio to {REFERENCE}; ids equal to its ids)",
        "",
        "| cell | " + " | ".join(engines) + " |",
        "|---|" + "--:|" * len(engines),
    ]
    for name, cell in report["cells"].items():
        same = report["identical"].get(name, {})
        row = []
        for engine in engines:
            numbers = cell[engine]
            rate = sorted(numbers["tokens_per_s"])[len(numbers["tokens_per_s"]) // 2]
            text = f"{rate:,.0f} ({numbers['ratio']:.2f}×"
            if engine in same:
                text += f"; {same[engine][0]}/{same[engine][1]}"
            row.append(text + ")")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    if report.get("memory"):
        lines += [
            "",
            "| memory, MiB | GPU (nvidia-smi) | torch reserved | peak RSS |",
            "|---|--:|--:|--:|",
        ]
        for name, numbers in report["memory"].items():
            if "error" in numbers:
                lines.append(f"| {name} | error: {numbers['error']} | | |")
                continue
            gpu = numbers.get("gpu_mib")
            torch_mib = numbers.get("torch_max_reserved_mib")
            lines.append(
                f"| {name} | {gpu if gpu is not None else 'n/a'} | "
                f"{f'{torch_mib:,.0f}' if torch_mib is not None else ''} | "
                f"{numbers['peak_rss_mib']:,.0f} |"
            )
    lines += ["", report["setting"]]
    return "\n".join(lines)


def device_name(provider: str) -> str:
    """The GPU's name (nvidia-smi), or the CPU's."""
    if provider == "cuda":
        try:
            command = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
            return subprocess.run(command, capture_output=True, text=True).stdout.strip()
        except OSError:
            return "an unnamed GPU"
    from harness import cpu_info

    return cpu_info()["model"]


# -- the command line ---------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see --help)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("work", type=Path, help="directory keeping the checkpoint and bundle")
    parser.add_argument("--model", type=Path, help="a MarianMT save_pretrained directory to use")
    parser.add_argument("--tiny", action="store_true", help="a tiny checkpoint (seconds)")
    parser.add_argument("--inputs", type=positive_int, default=128, help="sources (default 128)")
    add_cell_options(parser)
    parser.set_defaults(batch_sizes=(1, 32, 128), passes=2)
    parser.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, help="(default 64)")
    parser.add_argument("--variants", default="fp32,fp16,search", help="edgeseq export --variants")
    parser.add_argument(
        "--engines",
        type=lambda text: tuple(text.split(",")),
        default=ENGINES,
        help=f"comma-separated, from {', '.join(ENGINES)} (default all; {REFERENCE} always)",
    )
    parser.add_argument("--export-inputs", type=positive_int, default=64)
    parser.add_argument("--max-metric-drop", type=float, default=100.0)
    parser.add_argument("--no-verify", action="store_true", help="export without parity checks")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory processes")
    parser.add_argument("--json", type=Path, help="write every number to this JSON file")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    args.engines = tuple(dict.fromkeys((REFERENCE, *args.engines)))
    args.batch_sizes = tuple(args.batch_sizes)
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build, export, measure (module docstring); return the report."""
    import torch
    from marian_opus import held_out_sentences

    args.work.mkdir(parents=True, exist_ok=True)
    marian = prepare_model(args)
    texts = held_out_sentences(args.inputs)
    (args.work / "inputs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    heldout = args.work / "heldout.txt"
    heldout.write_text("\n".join(held_out_sentences(args.export_inputs)) + "\n", encoding="utf-8")
    bundle, export_s = prepare_bundle(args, marian, heldout)
    sources, text_of, differ = source_ids(marian, texts, bundle)
    torch.set_num_threads(args.threads)
    engines: list[Engine] = [make_engine(n, args, marian, bundle, text_of) for n in args.engines]
    cells = measure(
        engines, sources, args.batch_sizes, args.beams, args.passes, reference=REFERENCE
    )
    names = [e.name for e in engines]
    identical_cells = identical(engines, REFERENCE)
    del engines[:]  # the last references: the GPU is free for the memory processes
    if args.provider == "cuda":
        torch.cuda.empty_cache()
    return {
        "device": device_name(args.provider),
        "provider": args.provider,
        "sources": f"{len(sources)} held-out sentences ({differ} left out: tokenized differently)",
        "max_new_tokens": args.max_new_tokens,
        "export_s": export_s,
        "engines": names,
        "reference": REFERENCE,
        "cells": cells,
        "identical": identical_cells,
        "memory": {} if args.no_memory else memory(args, names),
        "setting": (
            f"{args.passes} passes, {args.threads} CPU thread(s), max {args.max_new_tokens} new "
            "tokens; "
            + ", ".join(f"{k} {v}" for k, v in versions(("onnxruntime", "torch")).items())
        ),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark, or one engine's memory worker."""
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    report = run(args)
    emit_report(report, args.json, report_text(report))


if __name__ == "__main__":
    main()
