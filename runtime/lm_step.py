"""The GPT bundle's graph as a `StepModel` (runtime/step.py), so runtime/search.py's greedy,
beam search and sampling continue prompts unchanged; torch-free.

    step_model = OrtGPTStep(session, config)
    tokens = greedy_search(step_model, prompt_ids, max_new_tokens=20)

`start(prompt_ids)` takes right-padded prompts int64 (B, S) without `<s>` (S may be 0: every
row starts from `<s>` alone) and only remembers them. The first `step` receives `<s>` (B, 1),
what search feeds first, and runs `<s>` + prompt in one call (past length 0), returning the
logits at each row's last real token as (B, 1, V). Later steps feed new tokens after the
cache. The pads of shorter prompts stay in the cache, hidden by `attention_mask`; a row's
positions count its real tokens only, so a prompt's continuation does not depend on the
other prompts of its batch (docs/bundle.md, "GPT: one KV-cached decoder graph").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from . import lm_constants as L
from .config import ModelConfig
from .errors import InputTooLongError, OptionsError


@dataclass(frozen=True)
class GPTState:
    """The cache (L keys then L values, each float32 (B, H, P, dh)), its mask int64 (B, P),
    each row's next position int64 (B,), and the prompt int64 (B, S) still to run (None once
    run)."""

    past_k: tuple[np.ndarray, ...]
    past_v: tuple[np.ndarray, ...]
    mask: np.ndarray
    next_pos: np.ndarray
    prompt: np.ndarray | None

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.next_pos.shape[0])

    @property
    def past_len(self) -> int:
        """Cache slots filled, pads of shorter prompts included."""
        return int(self.mask.shape[1])


class OrtGPTStep:
    """Runs a GPT bundle's `model.onnx` one step at a time on an onnxruntime session."""

    def __init__(self, session: ort.InferenceSession, config: ModelConfig) -> None:
        self.session = session
        self.config = config
        self.max_len, self.vocab_size = config.max_len, config.tgt_vocab_size
        self.bos_id, self.eos_id, self.pad_id = config.bos_id, config.eos_id, config.pad_id
        self.layers = config.n_decoder_layers
        self.outputs = list(L.gpt_outputs(self.layers))

    def start(self, prompt_ids: np.ndarray) -> GPTState:
        """Remember right-padded prompts int64 (B, S) (S may be 0); the cache is empty."""
        prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(len(prompt_ids), -1)
        batch, cfg = prompt.shape[0], self.config
        empty = np.zeros((batch, cfg.n_heads, 0, cfg.d_head), dtype=np.float32)
        cache = (empty,) * self.layers
        mask = np.zeros((batch, 0), dtype=np.int64)
        return GPTState(cache, cache, mask, np.zeros(batch, dtype=np.int64), prompt)

    def step(self, state: GPTState, input_ids: np.ndarray) -> tuple[np.ndarray, GPTState]:
        """input_ids int64 (B, N) -> logits float32 (B, N, V) (the first step: N = 1, the
        logits after `<s>` + the whole prompt) and the extended state."""
        ids = np.asarray(input_ids, dtype=np.int64)
        batch, new = ids.shape
        last = None
        if state.prompt is not None:
            if new != 1:
                raise OptionsError("the first step of a GPT takes one token (<s>)")
            keep = (state.prompt != self.pad_id).astype(np.int64)
            ids = np.concatenate([ids, state.prompt], axis=1)  # (B, 1+S)
            mask = np.concatenate([np.ones((batch, 1), np.int64), keep], axis=1)
            positions = np.cumsum(mask, axis=1) - 1  # a pad repeats the last real position
            last = keep.sum(axis=1)  # index of each row's last real token in `ids`
        else:
            mask = np.ones((batch, new), dtype=np.int64)
            positions = state.next_pos[:, None] + np.arange(new, dtype=np.int64)
        if int(positions.max()) >= self.max_len:
            raise InputTooLongError(
                f"the sequence needs {int(positions.max()) + 1} positions but the model's "
                f"max_len is {self.max_len}; shorten the prompt or generate fewer tokens"
            )
        full_mask = np.concatenate([state.mask, mask], axis=1)
        feeds = {L.INPUT_IDS: ids, L.ATTENTION_MASK: full_mask, L.POSITION_IDS: positions}
        for i in range(self.layers):
            feeds[L.PAST_KEY % i] = state.past_k[i]
            feeds[L.PAST_VALUE % i] = state.past_v[i]
        logits, *presents = self.session.run(self.outputs, feeds)
        if last is not None:
            logits = logits[np.arange(batch), last][:, None]  # (B, 1, V)
        next_pos = positions.max(axis=1) + 1
        new_state = GPTState(
            tuple(presents[0::2]), tuple(presents[1::2]), full_mask, next_pos, None
        )
        return np.asarray(logits, dtype=np.float32), new_state

    def select(self, state: GPTState, rows: np.ndarray) -> GPTState:
        """A state holding batch rows `rows` (int64 (B',), may repeat) of `state`."""
        idx = np.asarray(rows, dtype=np.int64)
        return GPTState(
            tuple(t[idx] for t in state.past_k),
            tuple(t[idx] for t in state.past_v),
            state.mask[idx],
            state.next_pos[idx],
            None if state.prompt is None else state.prompt[idx],
        )
