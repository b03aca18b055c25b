"""Peak resident memory (RSS) of edgeseq and CTranslate2 on the checkpoint of a
`vs_optimum.py` run, each engine and cell in a fresh process.

    python benchmarks/marian_rss.py runs/vs-optimum --inputs 64 --json rss.json

WORK is a `vs_optimum.py` work directory (`make bench-marian` makes `runs/vs-optimum`): its
MarianMT checkpoint (WORK/marian), edgeseq bundle (WORK/bundle, the default export) and
CTranslate2 conversion (WORK/ct2). For every engine (edgeseq fp32 and int8, CTranslate2
float32 and int8, one intra-op thread each) and every cell (`--beams` x `--batch-sizes`),
one process:

1. imports the engine's library (onnxruntime and edgeseq's runtime, or ctranslate2) and
   reads its RSS: `base`, what the interpreter and the library hold before any model;
2. loads the model (`Generator.load(bundle, variant=...)`, `ctranslate2.Translator`) and
   reads its RSS, `loaded`, and its peak so far, `load_peak` (files parsed while loading);
3. decodes the held-out inputs of the cell as `vs_optimum.py` does (sorted by length, in
   batches, same search) and reads its peak RSS (VmHWM of /proc/self/status): `peak`.

The table gives `peak` and `peak - base` (what the model and its decoding cost) per engine
and cell, and the ratio of edgeseq's `peak - base` over CTranslate2's of the same precision.
Memory does not depend on the machine's load; the seconds printed are not a benchmark
(one run, in a process that also measures memory): use vs_optimum.py for speed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import cell_name, cpu_info, cut, positive_int, say  # noqa: E402
from peak_rss import status_mb  # noqa: E402

ENGINES = ("edgeseq fp32", "edgeseq int8", "ctranslate2 fp32", "ctranslate2 int8")
PAIRS = (("edgeseq fp32", "ctranslate2 fp32"), ("edgeseq int8", "ctranslate2 int8"))


def write_inputs(work: Path, count: int) -> Path:
    """WORK/rss-inputs.json: the Marian ids and text of `count` held-out sentences (those
    edgeseq tokenizes as MarianTokenizer does), so that workers need no transformers."""
    from marian_opus import held_out_sentences
    from vs_optimum import source_ids

    sources, text_of, _ = source_ids(work / "marian", held_out_sentences(count), work / "bundle")
    path = work / "rss-inputs.json"
    path.write_text(json.dumps({"sources": sources, "texts": [text_of[tuple(s)] for s in sources]}))
    return path


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One engine, one cell, in this process: base, loaded and peak RSS in MB."""
    inputs = json.loads((args.work / "rss-inputs.json").read_text())
    sources = inputs["sources"]
    text_of = {tuple(s): t for s, t in zip(sources, inputs["texts"], strict=True)}
    family, precision = args.worker.split()
    if family == "edgeseq":
        from vs_optimum_engines import EdgeseqEngine

        import edgeseq.runtime.generator  # noqa: F401  (onnxruntime, numpy, the tokenizer)

        base = status_mb("self", "VmRSS")
        engine: Any = EdgeseqEngine(precision, args.work / "bundle", 1, text_of, args.max_new)
    else:
        import ctranslate2  # noqa: F401
        from vs_optimum_engines import Ct2Engine

        base = status_mb("self", "VmRSS")
        vocab = json.loads((args.work / "marian" / "vocab.json").read_text(encoding="utf-8"))
        compute = {"fp32": "float32", "int8": "int8"}[precision]
        ct2 = args.work / "ct2"
        engine = Ct2Engine(args.worker, ct2, compute, 1, vocab, args.max_new)
    loaded, load_peak = status_mb("self", "VmRSS"), status_mb("self", "VmHWM")
    start = time.perf_counter()
    _, tokens = engine.decode(cut(sources, args.batch), args.beam)
    seconds = time.perf_counter() - start
    peak = status_mb("self", "VmHWM")
    return {"base_mb": base, "loaded_mb": loaded, "load_peak_mb": load_peak, "peak_mb": peak,
            "model_peak_mb": peak - base, "seconds": seconds, "tokens": tokens}  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every engine and cell in its own process; the report."""
    write_inputs(args.work, args.inputs)
    cells: dict[str, dict[str, Any]] = {}
    for beam in args.beams:
        for batch in args.batch_sizes:
            cell = cells.setdefault(cell_name(beam, batch), {})
            for engine in args.engines:
                say(f"{cell_name(beam, batch)}: {engine}")
                command = [sys.executable, __file__, str(args.work), "--worker", engine,
                           "--beam", str(beam), "--batch", str(batch),
                           "--max-new-tokens", str(args.max_new)]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{engine} failed:\n{done.stderr[-2000:]}")
                cell[engine] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"work": str(args.work), "inputs": args.inputs, "cells": cells, "machine": cpu_info()}


def table(report: dict[str, Any]) -> str:
    """Markdown: peak and peak - base per engine and cell, then edgeseq over CTranslate2."""
    cells = report["cells"]
    engines = [e for e in ENGINES if any(e in c for c in cells.values())]
    lines = ["| MB: peak (model + decoding) | " + " | ".join(cells) + " |",
             "|---|" + "--:|" * len(cells)]  # fmt: skip
    for engine in engines:
        row = [
            f"{c[engine]['peak_mb']:.0f} ({c[engine]['model_peak_mb']:.0f})" for c in cells.values()
        ]
        lines.append(f"| {engine} | " + " | ".join(row) + " |")
    for ours, theirs in PAIRS:
        if ours in engines and theirs in engines:
            row = [f"{c[ours]['model_peak_mb'] / c[theirs]['model_peak_mb']:.2f}×"
                   for c in cells.values()]  # fmt: skip
            lines.append(f"| {ours} / {theirs} (model + decoding) | " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path, help="a vs_optimum.py work directory")
    parser.add_argument("--inputs", type=positive_int, default=64)
    parser.add_argument("--beams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 32])  # fmt: skip
    parser.add_argument("--engines", type=lambda s: s.split(","), default=list(ENGINES))
    parser.add_argument("--max-new-tokens", dest="max_new", type=positive_int, default=96)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workers, print the table (and write --json). Returns the exit status."""
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    report = measure(args)
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
