"""PyTorch adapter for the step interface (`edgeseq.runtime.step.StepModel`).

    step_model = TorchStep(model)                  # model: Seq2SeqTransformer (eval mode)
    tokens = greedy_search(step_model, src_ids, max_new_tokens=50)

The same search code then drives PyTorch and onnxruntime, so parity compares engines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .model import Cache, Seq2SeqTransformer


@dataclass
class TorchState:
    """Decoder state: cross K/V and cache, L-tuples of (B, H, S or P, dh); src_keep (B, S)."""

    cross_k: Cache
    cross_v: Cache
    src_keep: Tensor
    past_k: Cache
    past_v: Cache

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.src_keep.shape[0])

    @property
    def past_len(self) -> int:
        """Target positions already cached."""
        return int(self.past_k[0].shape[2])


class TorchStep:
    """Runs `Seq2SeqTransformer.encode` / `decode_step` under `torch.inference_mode`."""

    def __init__(self, model: Seq2SeqTransformer, device: str | torch.device = "cpu") -> None:
        self.model = model.eval().to(device)
        self.device = torch.device(device)
        cfg = model.cfg
        self.max_len, self.vocab_size = cfg.max_len, cfg.tgt_vocab_size
        self.max_positions = cfg.max_positions
        self.bos_id, self.eos_id, self.pad_id = cfg.start_id, cfg.eos_id, cfg.pad_id

    @torch.inference_mode()
    def start(self, src_ids: np.ndarray) -> TorchState:
        """Encode src_ids int64 (B, S) and return a state with an empty cache."""
        src = torch.as_tensor(np.asarray(src_ids, dtype=np.int64), device=self.device)
        src_keep = self.model.source_keep(src)
        memory = self.model.encode(src, src_keep)  # (B, S, D)
        cross_k, cross_v = self.model.cross_kv(memory)
        past_k, past_v = self.model.empty_cache(src.shape[0], memory)
        return TorchState(cross_k, cross_v, src_keep, past_k, past_v)

    @torch.inference_mode()
    def step(self, state: TorchState, input_ids: np.ndarray) -> tuple[np.ndarray, TorchState]:
        """input_ids int64 (B, N) -> logits float32 (B, N, V) and the extended state."""
        ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64), device=self.device)
        logits, past_k, past_v = self.model.decode_step(
            ids, state.past_k, state.past_v, state.cross_k, state.cross_v, state.src_keep
        )
        new_state = TorchState(state.cross_k, state.cross_v, state.src_keep, past_k, past_v)
        return logits.float().cpu().numpy(), new_state

    def select(self, state: TorchState, rows: np.ndarray) -> TorchState:
        """Gather batch rows (int64 (B',), may repeat) of every tensor in the state."""
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=self.device)

        def take(tensors: Cache) -> Cache:
            return tuple(t.index_select(0, idx) for t in tensors)

        return TorchState(
            take(state.cross_k),
            take(state.cross_v),
            state.src_keep.index_select(0, idx),
            take(state.past_k),
            take(state.past_v),
        )
