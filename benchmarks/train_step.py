"""Training cost on this machine: padding per `bucket_noise`, and seconds per step fp32 vs bf16.

    python benchmarks/train_step.py --recipe models/recipes/g2p-small.json --task g2p --threads 2

Padding: the share of padded positions in one epoch's batches of the task's training split
(`tasks.make_batches` with the recipe's `batch_tokens`), for several `bucket_noise` values.
Speed: `Trainer.train_step` (the real update: forward, label-smoothed loss, backward,
clipping, Adam) on the same batches, alternating fp32 and bf16 so both see the same load;
the median seconds per step and tokens per second of each. bf16 needs a CPU with native
bfloat16 instructions (`avx512_bf16` or AMX); elsewhere it is emulated and slower.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from edgeseq.build_model.batching import collate
from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.build_model.recipe import Recipe
from edgeseq.build_model.tasks import load_task, make_batches
from edgeseq.build_model.train import Trainer
from edgeseq.runtime.errors import EdgeseqError

NOISES = (0.0, 0.1, 0.3, 0.7)


def padding(lengths: list[tuple[int, int]], batch_tokens: int, noise: float) -> float:
    """Share of padded positions over one epoch of batches."""
    batches = make_batches(lengths, batch_tokens, np.random.default_rng(0), noise)
    real = sum(lengths[i][0] + lengths[i][1] for rows in batches for i in rows)
    area = sum(
        len(rows) * (max(lengths[i][0] for i in rows) + max(lengths[i][1] for i in rows))
        for rows in batches
    )
    return 1 - real / area


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True, help="recipe JSON (models/recipes/)")
    parser.add_argument("--task", default="g2p", help="built-in task (default g2p)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per precision")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        recipe, task = Recipe.load(args.recipe), load_task(args.task)
    except EdgeseqError as exc:
        parser.exit(1, f"error: {exc}\n")
    tokenizers = task.build_tokenizers()
    cfg = recipe.model_config(tokenizers.source.vocab_size, tokenizers.target.vocab_size)
    torch.manual_seed(0)
    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best": None, "seed": 0}
    with tempfile.TemporaryDirectory() as out:
        model = Seq2SeqTransformer(cfg)
        trainer = Trainer(model, tokenizers, task, recipe, Path(out), state, recipe.epochs, False)
        pairs = len(trainer.examples)
        print(f"{args.task}: {pairs} training pairs, batch_tokens {recipe.batch_tokens}")
        print("| bucket_noise | padded positions |\n|--:|--:|")
        for noise in NOISES:
            print(f"| {noise} | {padding(trainer.lengths, recipe.batch_tokens, noise):.1%} |")
        rng = np.random.default_rng(1)
        batches = make_batches(trainer.lengths, recipe.batch_tokens, rng, recipe.bucket_noise)
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        tokens = 0
        for index in range(args.steps + 2):  # two warm-up steps
            src, tgt_in, tgt_out = collate(trainer.examples, batches[index], cfg)
            if index >= 2:
                tokens += int((src != cfg.pad_id).sum() + (tgt_out != cfg.pad_id).sum())
            for precision in ("fp32", "bf16") if index % 2 else ("bf16", "fp32"):
                trainer.recipe = dataclasses.replace(recipe, precision=precision)
                start = time.perf_counter()
                trainer.train_step(src, tgt_in, tgt_out)
                if index >= 2:
                    times[precision].append(time.perf_counter() - start)
    print(f"\n{args.steps} steps each, {args.threads} thread(s), the same batches, alternating")
    print("| precision | s/step (median) | tokens/s |\n|---|--:|--:|")
    for precision, values in times.items():
        rate = tokens / sum(values)
        print(f"| {precision} | {statistics.median(values):.3f} | {rate:,.0f} |")
    ratio = statistics.median(times["fp32"]) / statistics.median(times["bf16"])
    print(f"bf16 speed-up: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
