"""The seam between search and engine: a decoder that can be stepped.

Search algorithms (`runtime/search.py`) are written once against `StepModel`; the ONNX
bundle (`runtime/kinds/seq2seq.py`) and PyTorch (`build_model/torch_step.py`) each implement it,
so parity compares engines, not two copies of the search.

    state = model.start(src_ids)                 # run the encoder, empty self-attention cache
    logits, state = model.step(state, input_ids) # (B, N, V) float32 for tokens at past_len..
    state = model.select(state, rows)            # keep / repeat / reorder batch rows

Optional: a model whose decoder graph returns the search's outputs (docs/bundle.md) has
`top_width` k > 0 and `step_top(state, input_ids, k)` -> (ids int64 (B, k), log-probabilities
float64 (B, k), state) of the next token after the last position; the searches then never
read the logits (runtime/kinds/ort_step.py). Without them (`top_width` absent or 0) they do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class StepState(Protocol):
    """Engine-specific decoder state: cross K/V, source mask and self-attention cache."""

    @property
    def batch(self) -> int:
        """Rows in the state."""
        ...

    @property
    def past_len(self) -> int:
        """Target positions already in the cache (the position of the next token)."""
        ...


@dataclass(frozen=True)
class WrappedState:
    """The state of a `StepModel` that wraps another (runtime/prefix.py, runtime/rules.py):
    the inner model's state, whose batch and cache length it reports."""

    inner: Any

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.inner.batch)

    @property
    def past_len(self) -> int:
        """Target positions already in the cache."""
        return int(self.inner.past_len)


def max_positions(model: object) -> int:
    """Positions a source or a generation of `model` (a StepModel) may use: its
    `max_positions` where it has one (ModelConfig.max_positions), else its max_len."""
    return int(getattr(model, "max_positions", None) or model.max_len)  # type: ignore[attr-defined]


@runtime_checkable
class StepModel(Protocol):
    """An encoder–decoder that search can drive one step at a time."""

    max_len: int  # positional table rows (past_len + new_len <= it), the default budget
    # Optional: `max_positions`, past max_len where the model has no table (positional
    # "relative", T5's): the cap on sources and generations (`max_positions` below).
    vocab_size: int  # target vocabulary size (logits width)
    bos_id: int  # the token search feeds first (ModelConfig.start_id)
    eos_id: int
    pad_id: int

    def start(self, src_ids: np.ndarray) -> StepState:
        """Encode `src_ids` int64 (B, S), right-padded with pad_id; empty cache."""
        ...

    def step(self, state: StepState, input_ids: np.ndarray) -> tuple[np.ndarray, StepState]:
        """Feed input_ids int64 (B, N) -> logits float32 (B, N, V) and the extended state."""
        ...

    def select(self, state: StepState, rows: np.ndarray) -> StepState:
        """A state holding batch rows `rows` (int64 (B',), may repeat) of `state`."""
        ...
