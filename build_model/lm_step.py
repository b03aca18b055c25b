"""PyTorch step adapter for a GPT (`edgeseq.runtime.step.StepModel`), so the search code of
runtime/search.py continues prompts with a `DecoderOnlyTransformer`.

    step_model = TorchGPTStep(model)
    continuations = greedy_search(step_model, prompt_ids, max_new_tokens=20)

`start(prompt_ids)` takes right-padded prompts (no `<s>`, no `</s>`; an empty prompt is a
(B, 0) array) and only remembers them. The first `step` receives `<s>` (what search feeds
first) and runs `<s>` + prompt in one call, returning the logits at each row's last real
token as (B, 1, V); later steps feed the new tokens after the cache. Pads left inside the
cache by shorter prompts are hidden by the attention mask; positions count real tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from edgeseq.runtime.errors import InputTooLongError, OptionsError

from .lm import DecoderOnlyTransformer
from .model import Cache


@dataclass
class GPTState:
    """Cache (L-tuples of (B, H, P, dh)), its mask (B, P) int64, each row's next position
    (B,) int64, and the prompt (B, S) still to run (None once run)."""

    past_k: Cache
    past_v: Cache
    mask: Tensor
    next_pos: Tensor
    prompt: Tensor | None

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.next_pos.shape[0])

    @property
    def past_len(self) -> int:
        """Cache slots filled (pads of shorter prompts included)."""
        return int(self.mask.shape[1])


class TorchGPTStep:
    """Runs `DecoderOnlyTransformer.step` under `torch.inference_mode`."""

    def __init__(self, model: DecoderOnlyTransformer) -> None:
        self.model = model.eval()
        cfg = model.cfg
        self.max_len, self.vocab_size = cfg.max_len, cfg.tgt_vocab_size
        self.bos_id, self.eos_id, self.pad_id = cfg.bos_id, cfg.eos_id, cfg.pad_id

    def start(self, prompt_ids: np.ndarray) -> GPTState:
        """Remember right-padded prompts int64 (B, S) (S may be 0) with an empty cache."""
        prompt = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64)).reshape(
            len(prompt_ids), -1
        )
        batch = prompt.shape[0]
        past_k, past_v = self.model.empty_cache(batch, self.model.output.weight)
        empty = torch.zeros(batch, 0, dtype=torch.int64)
        return GPTState(past_k, past_v, empty, torch.zeros(batch, dtype=torch.int64), prompt)

    @torch.inference_mode()
    def step(self, state: GPTState, input_ids: np.ndarray) -> tuple[np.ndarray, GPTState]:
        """input_ids int64 (B, N) -> logits float32 (B, N, V) (the first step: N = 1, the
        logits after the whole prompt) and the extended state."""
        ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
        batch, new = ids.shape
        if state.prompt is not None:
            if new != 1:
                raise OptionsError("the first step of a GPT takes one token (<s>)")
            keep = (state.prompt != self.pad_id).long()
            ids = torch.cat([ids, state.prompt], dim=1)  # (B, 1+S)
            mask = torch.cat([torch.ones(batch, 1, dtype=torch.int64), keep], dim=1)
            positions = torch.cumsum(mask, dim=1) - 1  # pads repeat the last real position
            last = keep.sum(dim=1)  # index of each row's last real token
        else:
            mask = torch.ones(batch, new, dtype=torch.int64)
            positions = state.next_pos[:, None] + torch.arange(new)
            last = None
        if int(positions.max()) >= self.max_len:
            raise InputTooLongError(
                f"the sequence needs {int(positions.max()) + 1} positions but the model's "
                f"max_len is {self.max_len}; shorten the prompt or generate fewer tokens"
            )
        full_mask = torch.cat([state.mask, mask], dim=1)
        logits, past_k, past_v = self.model.step(
            ids, positions, full_mask, state.past_k, state.past_v
        )
        if last is not None:
            logits = logits[torch.arange(batch), last][:, None]  # (B, 1, V)
        next_pos = positions.max(dim=1).values + 1
        new_state = GPTState(past_k, past_v, full_mask, next_pos, None)
        return logits.float().numpy(), new_state

    def select(self, state: GPTState, rows: np.ndarray) -> GPTState:
        """Gather batch rows (int64 (B',), may repeat) of every tensor in the state."""
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))

        def take(tensors: Cache) -> Cache:
            return tuple(t.index_select(0, idx) for t in tensors)

        prompt = None if state.prompt is None else state.prompt.index_select(0, idx)
        return GPTState(
            take(state.past_k),
            take(state.past_v),
            state.mask.index_select(0, idx),
            state.next_pos.index_select(0, idx),
            prompt,
        )
