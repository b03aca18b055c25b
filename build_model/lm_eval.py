"""Dev metrics of GPT and BERT models (the encoder–decoder's are in build_model/evaluation.py).

    metrics = lm_metrics(model, tokenizers, task, "dev", limit=500)   # {"exact_match": ...}

GPT (`words`): each distinct prompt of the split is continued greedily (runtime/search.py on
`TorchGPTStep`); exact match = prompt + continuation is one of the split's words for that
prompt. BERT (`stress`): exact match = accuracy of the predicted label (the argmax over the
label ids, specials excluded).
"""

from __future__ import annotations

import numpy as np
import torch

from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import greedy_search
from edgeseq.runtime.tokenizer import TokenizerPair

from .lm import DecoderOnlyTransformer, EncoderOnlyTransformer
from .lm_step import TorchGPTStep
from .tasks import Task


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


def lm_metrics(
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
