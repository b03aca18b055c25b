"""Ranking a beam step's candidates: each input's top k of (its hypotheses x vocabulary)
log-probabilities, largest first, ties by lower flat index (what a stable descending
argsort gives), without sorting everything.

    top = top_indices(values, k)                   # one input: flat (N,) values
    for start, top, values in ranked(candidates, row_input, k): ...   # every input of a step
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` largest of float (N,) `values`, largest first, ties by lower index:
    `np.argsort(-values, kind="stable")[:k]` without sorting all N (a beam step ranks
    beam x vocabulary candidates per input; a full sort was half of a beam search's time)."""
    if k >= values.size:
        return np.argsort(-values, kind="stable")[:k]
    threshold = values[np.argpartition(-values, k - 1)[:k]].min()
    index = np.flatnonzero(values >= threshold)  # ascending: ties keep index order
    return index[np.argsort(-values[index], kind="stable")[:k]]


def ranked_groups(candidates: np.ndarray, group: int, k: int) -> np.ndarray | None:
    """`top_indices(candidates[i*group:(i+1)*group].ravel(), k)` for every input i at once:
    candidates float (R, V), R = inputs x group (each input's rows contiguous) -> int64
    (inputs, k) flat indices into each input's (group x V) candidates. None when an input
    has fewer than k candidates or a tie straddles the k-th place (the caller then ranks
    input by input)."""
    rows, vocab = candidates.shape
    if rows % group or group * vocab <= k:
        return None
    values = candidates.reshape(rows // group, group * vocab)
    kth = -np.partition(-values, k - 1, axis=1)[:, k - 1]  # each input's k-th largest
    chosen = values >= kth[:, None]
    if not (chosen.sum(axis=1) == k).all():
        return None
    index = np.nonzero(chosen)[1].reshape(-1, k)  # ascending: ties keep index order
    order = np.argsort(-np.take_along_axis(values, index, axis=1), axis=1, kind="stable")
    return np.take_along_axis(index, order, axis=1)


def ranked(
    candidates: np.ndarray, row_input: list[int], k: int
) -> Iterator[tuple[int, list[int], list[float]]]:
    """Per input (a run of equal `row_input`), in row order: its first row and its top k
    candidates as flat indices into its rows' candidates (best first, ties by lower index)
    with their values. All inputs at once when they have the same number of rows."""
    starts = [0, *(r for r in range(1, len(row_input)) if row_input[r] != row_input[r - 1])]
    group = len(row_input) // len(starts)
    even = len(starts) > 1 and starts == list(range(0, len(row_input), group))
    tops = ranked_groups(candidates, group, k) if even else None
    if tops is not None:
        values = np.take_along_axis(candidates.reshape(len(starts), -1), tops, axis=1)
        for i, (top, vals) in enumerate(zip(tops.tolist(), values.tolist(), strict=True)):
            yield i * group, top, vals
        return
    for start, stop in zip(starts, [*starts[1:], len(row_input)], strict=True):
        flat = candidates[start:stop].ravel()
        top = top_indices(flat, k)
        yield start, top.tolist(), flat[top].tolist()
