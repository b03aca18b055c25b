"""Peak resident memory (RSS) of generating with edgeseq and with CTranslate2 on the same
Hugging Face checkpoint of any family, each engine and cell in a fresh process.

    ct2-transformers-converter --model CHECKPOINT --output_dir CT2_DIR
    edgeseq export CHECKPOINT --out BUNDLE
    python benchmarks/family_rss.py BUNDLE CT2_DIR --source-lang eng_Latn --target-lang fra_Latn

BUNDLE is edgeseq's export of the checkpoint, CT2_DIR CTranslate2's conversion of it. The
inputs are `--inputs` made-up English sentences (benchmarks/marian_opus.py's), tokenized by
the bundle's own tokenizer for both engines: CTranslate2 gets the token strings (with the
source language's token first and `</s>` last when `--source-lang` is given, and the target
language as its target prefix), edgeseq the text. Each worker reads its RSS after importing
its library (`base`), after loading the model (`loaded`), and its peak after decoding every
input at `--max-new-tokens` (VmHWM of /proc/self/status); the table gives the peak minus base
("model + decoding", marian_rss.py's method) and edgeseq's over CTranslate2's of the same
precision. Memory does not depend on the machine's load; the seconds are not a benchmark.
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
from harness import cell_name, cpu_info, positive_int, say  # noqa: E402
from peak_rss import status_mb  # noqa: E402

PRECISIONS = {"fp32": "float32", "int8": "int8"}  # edgeseq variant -> CTranslate2 compute type


def texts(count: int) -> list[str]:
    """`count` made-up sentences, shortest first (as the other benchmarks batch them)."""
    from marian_opus import held_out_sentences

    return sorted(held_out_sentences(count), key=len)


def language_token(bundle: Path, code: str | None) -> str | None:
    """The token string of language `code` in the bundle's tokenizer, as CTranslate2 takes
    it ("__en__" for M2M-100's "en"; NLLB's and mBART-50's codes are their tokens)."""
    if code is None:
        return None
    import tokenizers

    codes = json.loads((bundle / "config.json").read_text(encoding="utf-8"))["languages"]["codes"]
    tokenizer = tokenizers.Tokenizer.from_file(str(bundle / "tokenizer.json"))
    return tokenizer.id_to_token(codes[code])


def edgeseq_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Load the bundle's `--precision` variant and generate; RSS in MB, output tokens."""
    from edgeseq.runtime.generator import Generator
    from edgeseq.runtime.options import GenerationOptions

    inputs = texts(args.inputs)
    base = status_mb("self", "VmRSS")
    generator = Generator.load(args.bundle, variant=args.precision, threads=args.threads)
    loaded = status_mb("self", "VmRSS")
    options = GenerationOptions(
        beam_size=args.beam, max_new_tokens=args.max_new, batch_size=args.batch,
        source_lang=args.source_lang, target_lang=args.target_lang,
    )  # fmt: skip
    start = time.perf_counter()
    results = generator.generate(inputs, options)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    return measured(base, loaded, seconds, tokens)


def ct2_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Load CTranslate2's conversion at the precision's compute type and translate the same
    inputs as token strings (the bundle's tokenizer); RSS in MB, output tokens."""
    import ctranslate2
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(args.bundle / "tokenizer.json"))
    inputs = texts(args.inputs)
    base = status_mb("self", "VmRSS")
    translator = ctranslate2.Translator(
        str(args.ct2), device="cpu", intra_threads=args.threads,
        compute_type=PRECISIONS[args.precision],
    )  # fmt: skip
    loaded = status_mb("self", "VmRSS")
    source_token = language_token(args.bundle, args.source_lang)
    target_token = language_token(args.bundle, args.target_lang)
    first = [source_token] if source_token else []
    sources = [
        first + tokenizer.encode(text, add_special_tokens=False).tokens + ["</s>"]
        for text in inputs
    ]
    prefix = [[target_token]] * len(sources) if target_token else None
    start = time.perf_counter()
    results = translator.translate_batch(
        sources, target_prefix=prefix, beam_size=args.beam, max_batch_size=args.batch,
        max_decoding_length=args.max_new + (1 if prefix else 0),
    )  # fmt: skip
    seconds = time.perf_counter() - start
    tokens = sum(len(r.hypotheses[0]) for r in results)
    return measured(base, loaded, seconds, tokens)


def measured(base: float, loaded: float, seconds: float, tokens: int) -> dict[str, Any]:
    """A worker's report: base, loaded and peak RSS (MB), peak - base, seconds, tokens."""
    peak = status_mb("self", "VmHWM")
    return {"base_mb": base, "loaded_mb": loaded, "peak_mb": peak,
            "model_peak_mb": peak - base, "seconds": seconds, "tokens": tokens}  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every engine, precision and cell in its own process; the report."""
    cells: dict[str, dict[str, Any]] = {}
    for beam in args.beams:
        for batch in args.batch_sizes:
            cell = cells.setdefault(cell_name(beam, batch), {})
            for precision in args.precisions:
                for engine in ("edgeseq", "ctranslate2"):
                    name = f"{engine} {precision}"
                    say(f"{cell_name(beam, batch)}: {name}")
                    command = [sys.executable, __file__, str(args.bundle), str(args.ct2),
                               "--worker", engine, "--precision", precision,
                               "--beam", str(beam), "--batch", str(batch),
                               "--inputs", str(args.inputs), "--max-new-tokens", str(args.max_new),
                               "--threads", str(args.threads)]  # fmt: skip
                    for flag, value in (("--source-lang", args.source_lang),
                                        ("--target-lang", args.target_lang)):  # fmt: skip
                        command += [flag, value] if value else []
                    done = subprocess.run(command, capture_output=True, text=True, check=False)
                    if done.returncode != 0:
                        raise SystemExit(f"{name} failed:\n{done.stderr[-2000:]}")
                    cell[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"bundle": str(args.bundle), "ct2": str(args.ct2), "inputs": args.inputs,
            "threads": args.threads, "cells": cells, "machine": cpu_info()}  # fmt: skip


def table(report: dict[str, Any]) -> str:
    """Markdown: peak - base per engine and cell, then edgeseq over CTranslate2."""
    cells = report["cells"]
    engines = list(next(iter(cells.values())))
    lines = ["| MB: model + decoding | " + " | ".join(cells) + " |",
             "|---|" + "--:|" * len(cells)]  # fmt: skip
    for engine in engines:
        row = [f"{c[engine]['model_peak_mb']:,.0f}" for c in cells.values()]
        lines.append(f"| {engine} | " + " | ".join(row) + " |")
    for precision in PRECISIONS:
        ours, theirs = f"edgeseq {precision}", f"ctranslate2 {precision}"
        if ours in engines and theirs in engines:
            row = [f"{c[ours]['model_peak_mb'] / c[theirs]['model_peak_mb']:.2f}×"
                   for c in cells.values()]  # fmt: skip
            lines.append(f"| *{ours} / {theirs}* | " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="edgeseq's export of the checkpoint")
    parser.add_argument("ct2", type=Path, help="CTranslate2's conversion of the checkpoint")
    parser.add_argument("--inputs", type=positive_int, default=32)
    parser.add_argument("--beams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 32])  # fmt: skip
    parser.add_argument(
        "--precisions",
        type=lambda s: s.split(","),
        default=["fp32"],
        help="fp32 and/or int8 (edgeseq's variant, CTranslate2's compute type)",
    )
    parser.add_argument("--max-new-tokens", dest="max_new", type=positive_int, default=32)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--source-lang", help="source language code (NLLB: eng_Latn)")
    parser.add_argument("--target-lang", help="target language code (NLLB: fra_Latn)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--worker", choices=("edgeseq", "ctranslate2"), help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=tuple(PRECISIONS), help=argparse.SUPPRESS)
    parser.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workers, print the table (and write --json). Returns the exit status."""
    args = parse_args(argv)
    if args.worker:
        worker = edgeseq_worker if args.worker == "edgeseq" else ct2_worker
        print(json.dumps(worker(args)))
        return 0
    report = measure(args)
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
