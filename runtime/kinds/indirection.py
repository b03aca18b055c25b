"""The cache indirection of the in-place decoder: the small host-side int32 table that says
which buffer row holds each row's positions, and what a row selection does to it. Pure numpy,
shared by the step model whose buffers are numpy arrays (runtime/kinds/in_place.py) and the
one whose buffers are device OrtValues (runtime/kinds/in_place_device.py).

    selection = plan_select(state.indirection, state.width, state.past, rows)
    selection.kind         # "reorder", "blocks" or "resolve" (below)
    mark_written(indirection, past)      # after a step: each row wrote its own position

Rows are grouped in blocks of `width` W (an input's hypotheses in beam search, 1 in greedy
search): row n * W + w reads position t from buffer row n * W + indirection[n, w, t], an
int32 table (B / W, W, M) for buffers of M positions. A selection of rows is one of:
- "reorder": every row stays in its block (beam reordering): only the table changes;
- "blocks": whole blocks are kept (finished inputs leave): the buffer rows of the kept blocks
  (`source`) move, and the table rows move with them;
- "resolve": anything else (the first beam step repeats each input's row): new row i's
  position t is read from old buffer row `held[i, t]` into new buffers, whose blocks are the
  runs of rows that came from the same old block and whose table is the identity.

The rows of a block come from one old block, so from one source: a decoder whose cross K/V
and src_mask hold one row per block (`cross_rows`' `per_input`) keeps them through any
selection that keeps every block's source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import CacheFullError


@dataclass(frozen=True)
class Selection:
    """What `select(rows)` does to an in-place state (module docstring): `kind`, the new
    block `width` and `indirection` int32 (B' / width, width, M); for "blocks" the old buffer
    rows `source` int64 (B',) that become the new ones, whole blocks; for "resolve" `held`
    int64 (B', past): the old buffer row of each new row's position t."""

    kind: str  # "reorder", "blocks" or "resolve"
    width: int
    indirection: np.ndarray
    source: np.ndarray | None = None
    held: np.ndarray | None = None


def plan_select(indirection: np.ndarray, width: int, past: int, rows: np.ndarray) -> Selection:
    """The selection of batch rows `rows` int64 (B',) (may repeat) from a state of blocks of
    `width`, table `indirection` int32 (B / width, width, M) and `past` positions written."""
    batch, length = indirection.shape[0] * width, indirection.shape[2]
    old_block, count = rows // width, len(rows)
    flat = indirection.reshape(batch, length)
    if count == batch and np.array_equal(old_block, np.arange(count) // width):
        return Selection("reorder", width, flat[rows].reshape(indirection.shape))
    new_width = run_width(old_block)
    blocks = old_block.reshape(-1, width) if new_width == width else None
    if blocks is not None and (blocks == blocks[:, :1]).all():
        source = (blocks[:, :1] * width + np.arange(width)).ravel()  # whole old blocks
        return Selection("blocks", width, flat[rows].reshape(-1, width, length), source=source)
    held = old_block[:, None] * width + flat[rows, :past]
    return Selection("resolve", new_width, identity(count, new_width, length), held=held)


def cross_rows(
    source_rows: np.ndarray, width: int, rows: np.ndarray, new_width: int, per_input: bool
) -> np.ndarray | None:
    """The rows of a state's cross K/V and src_mask that the selection of batch rows `rows`
    (B',) into blocks of `new_width` keeps, from a state of blocks of `width` whose rows
    come from sources `source_rows` (B,): None when they stay as they are, else the old
    rows, int64: one per new row, or with `per_input` (the cross K/V hold one row per block,
    which a block's rows share) one per new block."""
    old_step, new_step = (width, new_width) if per_input else (1, 1)
    if np.array_equal(source_rows[rows][::new_step], source_rows[::old_step]):
        return None
    return rows[::new_step] // old_step


def identity(rows: int, width: int, length: int) -> np.ndarray:
    """The table of `rows` rows in blocks of `width` that each hold their own positions:
    int32 (rows / width, width, length)."""
    return np.broadcast_to(
        np.arange(width, dtype=np.int32)[None, :, None], (rows // width, width, length)
    ).copy()


def grown_indirection(indirection: np.ndarray, past: int, length: int) -> np.ndarray:
    """`indirection` (B / W, W, M) for buffers of `length` positions, its first `past` kept."""
    new = np.zeros((*indirection.shape[:2], length), np.int32)
    new[:, :, :past] = indirection[:, :, :past]
    return new


def mark_written(indirection: np.ndarray, past: int) -> None:
    """After a step: row n * W + w wrote its own position `past` (in place)."""
    indirection[:, :, past] = np.arange(indirection.shape[1], dtype=np.int32)


def run_width(old_block: np.ndarray) -> int:
    """The block width of rows that came from old blocks `old_block` (B',): the length of its
    runs of equal values when every run has the same length and no old block has two runs,
    else 1."""
    starts = np.flatnonzero(np.diff(old_block, prepend=-1) != 0)
    lengths = np.diff(np.append(starts, len(old_block)))
    unique = len(np.unique(old_block[starts])) == len(starts)
    return int(lengths[0]) if unique and (lengths == lengths[0]).all() else 1


def check_room(past: int, max_len: int) -> None:
    """Refuse a step at position `past` when the buffers hold max_len positions already."""
    if past >= max_len:
        raise CacheFullError(
            f"the in-place cache holds the model's max_len of {max_len} positions and all "
            f"are written: generate at most {max_len} tokens (max_new_tokens; the search "
            "functions stop there by themselves)"
        )


class Consumable(Protocol):
    """A state that `step` and `select` use once (`spent` afterwards)."""

    spent: bool


def check_live(state: Consumable) -> None:
    """Refuse a state that step or select already consumed."""
    if state.spent:
        raise ValueError(
            "this in-place decoder state was passed to step or select already: use the state "
            "that call returned (states are used once)"
        )
