"""Forced target prefixes: the first generated tokens of each row fixed in advance (a
target-language token of a multilingual model), for any `StepModel` and any search.

    model = ForcedPrefix(step_model, [[lang_id], [other_lang_id]])    # one prefix per row
    model = ForcedPrefix(step_model, [[lang_id]])                     # one for every row
    hyps = search(model, src_ids, options)      # each row's tokens start with its prefix

At step t < len(prefix) of a row, the wrapped model's logits are replaced by 0 at the row's
forced token and -inf elsewhere: the search takes that token with log-probability 0, as
transformers' forced_bos_token_id does, so the token counts in the hypothesis (its tokens,
its length for the length penalty, max_new_tokens) exactly as it does there. Rows keep their
own prefix through `select` (beam reordering, finished rows leaving), so one batch can mix
target languages. Prefixes of one batch have one length (pad a language list per row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .step import StepModel, StepState, WrappedState, max_positions


@dataclass(frozen=True)
class PrefixState(WrappedState):
    """The wrapped model's state, each row's forced tokens int64 (B, P) and the step count."""

    forced: np.ndarray
    steps: int


class ForcedPrefix:
    """A `StepModel` whose first steps force each row's prefix (see the module docstring)."""

    def __init__(self, model: StepModel, prefixes: Sequence[Sequence[int]]) -> None:
        widths = {len(p) for p in prefixes}
        if len(widths) > 1:
            raise ValueError(f"prefixes of one batch need one length, got {sorted(widths)}")
        self.model = model
        self.prefixes = np.asarray(prefixes, dtype=np.int64).reshape(len(prefixes), -1)
        self.max_len, self.vocab_size = model.max_len, model.vocab_size
        self.max_positions = max_positions(model)
        self.bos_id, self.eos_id, self.pad_id = model.bos_id, model.eos_id, model.pad_id
        self.top_width = getattr(model, "top_width", 0)
        # the wrapped step's values are log-probabilities (runtime/rules.py): so are the forced
        self.gives_logprobs = getattr(model, "gives_logprobs", False)

    def start(self, src_ids: np.ndarray) -> PrefixState:
        """Encode `src_ids` int64 (B, S); B must equal the number of prefixes (one prefix
        serves every row)."""
        prefixes = self.prefixes
        if len(prefixes) == 1:
            prefixes = np.repeat(prefixes, len(src_ids), axis=0)
        if len(src_ids) != len(prefixes):
            raise ValueError(f"{len(src_ids)} sources but {len(prefixes)} prefixes")
        return PrefixState(self.model.start(src_ids), prefixes, 0)

    def step(self, state: PrefixState, input_ids: np.ndarray) -> tuple[np.ndarray, PrefixState]:
        """The wrapped step; at a forced step the last position's logits force the token."""
        logits, inner = self.model.step(state.inner, input_ids)
        if state.steps < state.forced.shape[1]:
            logits = logits.copy()
            logits[:, -1] = -np.inf
            logits[np.arange(len(logits)), -1, state.forced[:, state.steps]] = 0.0
        return logits, PrefixState(inner, state.forced, state.steps + 1)

    def step_top(
        self, state: PrefixState, input_ids: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray, PrefixState]:
        """The wrapped `step_top`; at a forced step the forced token first, log-probability
        0, the other k - 1 at -inf."""
        ids, logprobs, inner = self.model.step_top(state.inner, input_ids, k)  # type: ignore[attr-defined]
        if state.steps < state.forced.shape[1]:
            ids, logprobs = ids.copy(), np.full_like(logprobs, -np.inf)
            ids[:, 0], logprobs[:, 0] = state.forced[:, state.steps], 0.0
        return ids, logprobs, PrefixState(inner, state.forced, state.steps + 1)

    def select(self, state: PrefixState, rows: np.ndarray) -> PrefixState:
        """The rows `rows` of the state, with their prefixes."""
        idx = np.asarray(rows, dtype=np.int64)
        return PrefixState(self.model.select(state.inner, idx), state.forced[idx], state.steps)


def forced(model: StepModel, prefixes: Sequence[Sequence[int]] | None) -> StepModel:
    """`model` forcing `prefixes` (one per row), or `model` itself when there are none."""
    if not prefixes or not any(prefixes):
        return model
    return ForcedPrefix(model, prefixes)  # type: ignore[return-value]


__all__ = ["ForcedPrefix", "PrefixState", "StepState", "forced"]
