"""Scoring a PyTorch model during and after training: dev loss, greedy/beam metrics, the curve.

metrics = evaluate_model(model, tokenizers, task, "test", search=None)   # WER, PER, ...
metrics = dev_metrics(model, task, tokenizers, recipe)                  # + dev_loss
metrics = exact_match_metrics(model, tokenizers, task, "dev")            # GPT and BERT
plot_log(out / "log.jsonl", out / "loss.png")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.metrics import evaluate_references
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import greedy_search
from edgeseq.runtime.tokenizer import TokenizerPair

from .batching import collate
from .decoder_only import DecoderOnlyTransformer, TorchGPTStep
from .encoder_only import EncoderOnlyTransformer
from .model import Seq2SeqTransformer
from .recipe import Recipe
from .tasks import Task, encode_pairs, make_batches
from .torch_step import TorchStep


@torch.no_grad()
def dev_loss(
    model: Seq2SeqTransformer,
    pairs: list[tuple[str, str]],
    tokenizers: TokenizerPair,
    batch_tokens: int,
) -> float:
    """Mean cross-entropy per target token (no label smoothing, eval mode) over `pairs`."""
    cfg = model.cfg
    model.eval()
    examples, _ = encode_pairs(pairs, tokenizers, cfg.max_len)
    lengths = [(len(s) + 1, len(t) + 1) for s, t in examples]
    total, count = 0.0, 0
    for rows in make_batches(lengths, batch_tokens, np.random.default_rng(0)):
        src, tgt_in, tgt_out = collate(examples, rows, cfg)
        logits = model(
            src, tgt_in
        )  # (B, T, V); a classifier's T is 1 (build_model/encoder_only.py)
        tgt_out = tgt_out[:, : logits.shape[1]]
        total += F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            tgt_out.reshape(-1),
            ignore_index=cfg.pad_id,
            reduction="sum",
        ).item()
        count += int((tgt_out != cfg.pad_id).sum())
    return total / max(count, 1)


def evaluate_model(
    model: Seq2SeqTransformer,
    tokenizers: TokenizerPair,
    task: Task,
    split: str = "dev",
    limit: int | None = None,
    batch_size: int = 128,
    search: Any = None,
) -> dict[str, float]:
    """Exact match, WER and token error rate ("per") of greedy decoding (or `search`, a
    callable (step_model, src_ids (B, S), max_new_tokens) -> ids per row) on the first
    `limit` sources of `split`; for G2P with stress also the stressless WER and PER."""
    tokenize = list if task.target_tokens_are_chars else str.split
    kwargs = {"search": search} if search is not None else {}
    return evaluate_references(
        TorchStep(model),
        tokenizers,
        task.references(split),
        limit=limit,
        batch_size=batch_size,
        tokenize=tokenize,
        with_stressless=task.has_stress,
        **kwargs,
    )


def plot_log(log_path: Path, png_path: Path) -> None:
    """Draw train loss per logged step and dev loss per evaluation from log.jsonl into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    records = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
    train_pts = [(r["step"], r.get("nll", r["loss"])) for r in records if r["event"] == "step"]
    dev_pts = [(r["step"], r["dev_loss"]) for r in records if r.get("event") == "eval"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for points, label in ((train_pts, "train"), (dev_pts, "dev")):
        if points:
            ax.plot(*zip(*points, strict=True), marker="." if label == "dev" else None, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy per token")
    ax.legend()
    fig.tight_layout()
    tmp = png_path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(png_path)


def dev_metrics(
    model: Seq2SeqTransformer, task: Task, tokenizers: TokenizerPair, recipe: Recipe
) -> dict[str, Any]:
    """Dev loss (no smoothing) over the first `eval_loss_max_items` dev pairs and greedy
    metrics over the first `eval_max_items` dev sources."""
    loss_pairs = task.dev[: recipe.eval_loss_max_items or None]
    metrics = {"dev_loss": dev_loss(model, loss_pairs, tokenizers, recipe.batch_tokens)}
    if model.cfg.architecture != "encoder-decoder":
        limit = recipe.eval_max_items or None
        return metrics | exact_match_metrics(
            model, tokenizers, task, "dev", limit, recipe.eval_batch_size
        )
    metrics.update(
        evaluate_model(
            model,
            tokenizers,
            task,
            "dev",
            limit=recipe.eval_max_items or None,
            batch_size=recipe.eval_batch_size,
        )
    )
    return metrics


# -- GPT and BERT: exact match. GPT (`words`): each distinct prompt of the split is continued
# greedily (runtime/search.py on `TorchGPTStep`); exact match = prompt + continuation is one
# of the split's words for that prompt. BERT (`stress`): accuracy of the predicted label (the
# argmax over the label ids, specials excluded).


def continue_prompts(
    model: DecoderOnlyTransformer, tokenizers: TokenizerPair, prompts: list[str]
) -> list[str]:
    """Greedy continuation of each prompt, returned as prompt + continuation text."""
    encoded = [tokenizers.source.encode(p) for p in prompts]
    budget = model.cfg.max_len - 1 - max((len(ids) for ids in encoded), default=0)
    batch = right_pad(encoded, model.cfg.pad_id) if encoded else np.zeros((0, 0), np.int64)
    found = greedy_search(TorchGPTStep(model), batch, max(budget, 0))
    return [
        prompt + tokenizers.target.decode(ids) for prompt, ids in zip(prompts, found, strict=True)
    ]


@torch.no_grad()
def predict_labels(
    model: EncoderOnlyTransformer, tokenizers: TokenizerPair, texts: list[str]
) -> list[int]:
    """Label id of each text: 4 + argmax over the non-special label logits."""
    cfg = model.cfg
    rows = [[*tokenizers.source.encode(t)[: cfg.max_len - 1], cfg.eos_id] for t in texts]
    ids = torch.as_tensor(right_pad(rows, cfg.pad_id))
    _, logits = model.eval().encode(ids, ids != cfg.pad_id)
    return (logits[:, len(SPECIAL_TOKENS) :].argmax(dim=-1) + len(SPECIAL_TOKENS)).tolist()


def exact_match_metrics(
    model: DecoderOnlyTransformer | EncoderOnlyTransformer,
    tokenizers: TokenizerPair,
    task: Task,
    split: str = "dev",
    limit: int | None = None,
    batch_size: int = 128,
) -> dict[str, float]:
    """{"exact_match": ...} over the first `limit` distinct sources of `split`."""
    refs = task.references(split)
    sources = list(refs)[:limit]
    hits = 0
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        if isinstance(model, DecoderOnlyTransformer):
            outputs = continue_prompts(model, tokenizers, chunk)
        else:
            ids = predict_labels(model, tokenizers, chunk)
            outputs = [tokenizers.target.decode([i]) for i in ids]
        hits += sum(out in refs[src] for src, out in zip(chunk, outputs, strict=True))
    return {"exact_match": hits / max(len(sources), 1)}
