"""Search algorithms, written once against the step interface (`runtime/step.py`).

    tokens = greedy_search(step_model, src_ids, max_new_tokens=64)   # list of id lists

Rows that finish (emit `</s>`) leave the batch, so later steps compute only for live rows.
"""

from __future__ import annotations

import numpy as np

from .errors import InputTooLongError
from .step import StepModel


def check_source_length(model: StepModel, src_ids: np.ndarray) -> None:
    """Refuse a source longer than the model's positional table."""
    if src_ids.shape[1] > model.max_len:
        raise InputTooLongError(
            f"source has {src_ids.shape[1]} tokens but the model's max_len is {model.max_len}; "
            "shorten the input or pass truncate=True"
        )


def greedy_search(model: StepModel, src_ids: np.ndarray, max_new_tokens: int) -> list[list[int]]:
    """Arg-max decoding. src_ids int64 (B, S) right-padded -> generated ids per row
    (without `<s>` and `</s>`), at most `max_new_tokens` each and within `max_len` positions."""
    check_source_length(model, src_ids)
    batch = src_ids.shape[0]
    state = model.start(src_ids)
    out: list[list[int]] = [[] for _ in range(batch)]
    live = np.arange(batch)  # original row index of each state row
    last = np.full((batch, 1), model.bos_id, dtype=np.int64)
    for _ in range(min(max_new_tokens, model.max_len)):
        logits, state = model.step(state, last)
        next_ids = logits[:, -1].argmax(axis=-1)  # (B_live,)
        finished = next_ids == model.eos_id
        for row, token, done in zip(live, next_ids, finished, strict=True):
            if not done:
                out[row].append(int(token))
        if finished.all():
            break
        if finished.any():
            keep = np.flatnonzero(~finished)
            state, live, next_ids = model.select(state, keep), live[keep], next_ids[keep]
        last = next_ids[:, None].astype(np.int64)
    return out
