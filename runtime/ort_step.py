"""onnxruntime adapter for the step interface: drives `encoder.onnx` and `decoder.onnx`.

    step_model = OrtStep.from_files("b/encoder.onnx", "b/decoder.onnx", config)
    tokens = greedy_search(step_model, src_ids, max_new_tokens=50)

Inputs and outputs are fed and read by name (`runtime/constants.py`), never by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from . import constants as C
from .config import ModelConfig


@dataclass
class OrtState:
    """Decoder state as numpy arrays: cross K/V and cache (L, B, H, *, dh), src_mask (B, S)."""

    cross_k: np.ndarray
    cross_v: np.ndarray
    src_mask: np.ndarray
    past_k: np.ndarray
    past_v: np.ndarray

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.src_mask.shape[0])

    @property
    def past_len(self) -> int:
        """Target positions already cached."""
        return int(self.past_k.shape[3])


class OrtStep:
    """Encoder and decoder-step sessions of one bundle, behind the StepModel interface."""

    def __init__(
        self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, config: ModelConfig
    ) -> None:
        self.encoder, self.decoder, self.config = encoder, decoder, config
        self.max_len, self.vocab_size = config.max_len, config.tgt_vocab_size
        self.bos_id, self.eos_id, self.pad_id = config.bos_id, config.eos_id, config.pad_id
        self.cache_dtype = np.float32

    @classmethod
    def from_files(
        cls,
        encoder_path: str | Path,
        decoder_path: str | Path,
        config: ModelConfig,
        providers: list[str] | None = None,
        options: ort.SessionOptions | None = None,
    ) -> OrtStep:
        """Open both graphs with `providers` (default: CPU)."""
        providers = providers or ["CPUExecutionProvider"]
        encoder = ort.InferenceSession(str(encoder_path), options, providers=providers)
        decoder = ort.InferenceSession(str(decoder_path), options, providers=providers)
        return cls(encoder, decoder, config)

    def start(self, src_ids: np.ndarray) -> OrtState:
        """Run the encoder on src_ids int64 (B, S); empty cache (L, B, H, 0, dh)."""
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        cross_k, cross_v = self.encoder.run([C.CROSS_K, C.CROSS_V], {C.SRC_IDS: src_ids})
        cfg = self.config
        empty = np.zeros(
            (cfg.n_decoder_layers, src_ids.shape[0], cfg.n_heads, 0, cfg.d_head), cross_k.dtype
        )
        return OrtState(cross_k, cross_v, src_ids != self.pad_id, empty, empty)

    def step(self, state: OrtState, input_ids: np.ndarray) -> tuple[np.ndarray, OrtState]:
        """input_ids int64 (B, N) -> logits float32 (B, N, V) and the extended state."""
        feeds = {
            C.INPUT_IDS: np.ascontiguousarray(input_ids, dtype=np.int64),
            C.PAST_K: state.past_k,
            C.PAST_V: state.past_v,
            C.CROSS_K: state.cross_k,
            C.CROSS_V: state.cross_v,
            C.SRC_MASK: state.src_mask,
        }
        logits, past_k, past_v = self.decoder.run(list(C.DECODER_OUTPUTS), feeds)
        new_state = OrtState(state.cross_k, state.cross_v, state.src_mask, past_k, past_v)
        return logits.astype(np.float32, copy=False), new_state

    def select(self, state: OrtState, rows: np.ndarray) -> OrtState:
        """Gather batch rows (int64 (B',), may repeat)."""
        rows = np.asarray(rows, dtype=np.int64)
        return OrtState(
            np.ascontiguousarray(state.cross_k[:, rows]),
            np.ascontiguousarray(state.cross_v[:, rows]),
            np.ascontiguousarray(state.src_mask[rows]),
            np.ascontiguousarray(state.past_k[:, rows]),
            np.ascontiguousarray(state.past_v[:, rows]),
        )
