"""The encoder–decoder's step model on numpy arrays (the CPU path of the two-graph loop).

    step_model = OrtStep.from_files("b/encoder.onnx", "b/decoder.onnx", config)
    tokens = greedy_search(step_model, src_ids, max_new_tokens=50)

`OrtStep` keeps the decoder state as numpy arrays; inputs and outputs are fed and read by name
(`runtime/constants.py`), never by position. runtime/kinds/seq2seq.py adds the IO-bound
device variant and the generator; runtime/kinds/in_place.py the in-place cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..config import ModelConfig
from ..providers import DISABLED_OPTIMIZERS

Layers = tuple[np.ndarray, ...]  # one (B, H, T, dh) array per decoder layer


@dataclass
class OrtState:
    """Decoder state as numpy arrays: cross K/V and cache, L-tuples of (B, H, *, dh),
    src_mask (B, S), and source_rows (B,) int64, the encoder row each state row came from
    (rows with the same source row have the same cross K/V and mask)."""

    cross_k: Layers
    cross_v: Layers
    src_mask: np.ndarray
    past_k: Layers
    past_v: Layers
    source_rows: np.ndarray

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.src_mask.shape[0])

    @property
    def past_len(self) -> int:
        """Target positions already cached."""
        return int(self.past_k[0].shape[2])


class OrtStep:
    """Encoder and decoder-step sessions of one bundle, behind the StepModel interface."""

    def __init__(
        self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, config: ModelConfig
    ) -> None:
        self.encoder, self.decoder, self.config = encoder, decoder, config
        self.max_len, self.vocab_size = config.max_len, config.tgt_vocab_size
        self.bos_id, self.eos_id, self.pad_id = config.bos_id, config.eos_id, config.pad_id
        self.cache_dtype = np.float32
        layers = self.layers = config.n_decoder_layers
        self.encoder_outputs = C.encoder_outputs(layers)
        self.decoder_outputs = C.decoder_outputs(layers)
        fed = (C.PAST_K, C.PAST_V, C.CROSS_K, C.CROSS_V)  # outputs: decoder_outputs
        self.names = {f: C.layer_names(f, layers) for f in fed}

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
        disabled = DISABLED_OPTIMIZERS
        encoder = ort.InferenceSession(
            str(encoder_path), options, providers=providers, disabled_optimizers=disabled
        )
        decoder = ort.InferenceSession(
            str(decoder_path), options, providers=providers, disabled_optimizers=disabled
        )
        return cls(encoder, decoder, config)

    def empty_cache(self, batch: int, dtype: type) -> Layers:
        """An empty cache: L arrays (B, H, 0, dh) (one shared zero-size array)."""
        cfg = self.config
        return (np.zeros((batch, cfg.n_heads, 0, cfg.d_head), dtype),) * self.layers

    def start(self, src_ids: np.ndarray) -> OrtState:
        """Run the encoder on src_ids int64 (B, S); empty cache (B, H, 0, dh) per layer."""
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        out = self.encoder.run(list(self.encoder_outputs[1:]), {C.SRC_IDS: src_ids})
        cross_k, cross_v = tuple(out[: self.layers]), tuple(out[self.layers :])
        empty = self.empty_cache(src_ids.shape[0], cross_k[0].dtype)
        rows = np.arange(src_ids.shape[0])
        return OrtState(cross_k, cross_v, src_ids != self.pad_id, empty, empty, rows)

    def feeds(self, state: OrtState, input_ids: np.ndarray) -> dict[str, np.ndarray]:
        """The decoder graph's inputs, by name."""
        feeds = {C.INPUT_IDS: np.ascontiguousarray(input_ids, dtype=np.int64)}
        for family, arrays in (
            (C.PAST_K, state.past_k),
            (C.PAST_V, state.past_v),
            (C.CROSS_K, state.cross_k),
            (C.CROSS_V, state.cross_v),
        ):
            feeds.update(zip(self.names[family], arrays, strict=True))
        feeds[C.SRC_MASK] = state.src_mask
        return feeds

    def step(self, state: OrtState, input_ids: np.ndarray) -> tuple[np.ndarray, OrtState]:
        """input_ids int64 (B, N) -> logits float32 (B, N, V) and the extended state."""
        out = self.decoder.run(list(self.decoder_outputs), self.feeds(state, input_ids))
        layers = self.layers
        past_k, past_v = tuple(out[1 : 1 + layers]), tuple(out[1 + layers :])
        new_state = OrtState(
            state.cross_k, state.cross_v, state.src_mask, past_k, past_v, state.source_rows
        )
        return out[0].astype(np.float32, copy=False), new_state

    def select(self, state: OrtState, rows: np.ndarray) -> OrtState:
        """Gather batch rows (int64 (B',), may repeat). Beam search reorders hypotheses
        among the rows of each input every step: when every new row comes from the same
        source row as the old row in its place, the cross K/V and mask are kept as they
        are, and only the self-attention cache is gathered."""
        rows = np.asarray(rows, dtype=np.int64)
        cross_k, cross_v, src_mask, source_rows = self.select_source(state, rows)
        return OrtState(
            cross_k, cross_v, src_mask, _take(state.past_k, rows), _take(state.past_v, rows),
            source_rows,
        )  # fmt: skip

    @staticmethod
    def select_source(
        state: OrtState, rows: np.ndarray
    ) -> tuple[Layers, Layers, np.ndarray, np.ndarray]:
        """Cross K/V, src_mask and source_rows of batch rows `rows` (int64 (B',)): the same
        arrays when every row keeps its source row, else gathered."""
        source_rows = state.source_rows[rows]
        if np.array_equal(source_rows, state.source_rows):
            return state.cross_k, state.cross_v, state.src_mask, source_rows
        src_mask = np.take(state.src_mask, rows, axis=0)
        return _take(state.cross_k, rows), _take(state.cross_v, rows), src_mask, source_rows


def _take(arrays: Layers, rows: np.ndarray) -> Layers:
    """Rows `rows` of each array (np.take: a contiguous copy, faster than a[rows])."""
    return tuple(np.take(a, rows, axis=0) for a in arrays)
