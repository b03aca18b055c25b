"""Right-padding of token-id lists into one int64 batch: the one place that builds a (B, S) array.

right_pad([[5, 6, 2], [7, 2]], pad_id=0)  # array([[5, 6, 2], [7, 2, 0]])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def right_pad(rows: Sequence[Sequence[int]], pad_id: int, width: int | None = None) -> np.ndarray:
    """Rows of ids right-padded with `pad_id`: int64 (B, S), S = `width` or the longest row."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out
