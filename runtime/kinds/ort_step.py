"""The encoder–decoder's step model on numpy arrays (the CPU path of the two-graph loop).

    step_model = OrtStep.from_files("b/encoder.onnx", "b/decoder.onnx", config)
    tokens = greedy_search(step_model, src_ids, max_new_tokens=50)

`OrtStep` keeps the decoder state as numpy arrays; inputs and outputs are fed and read by name
(`runtime/constants.py`), never by position. The cache is in the element type the graphs
declare (`input_dtype`): float32, or float16 in an fp16 bundle, whose logits and search
outputs stay float32 (docs/bundle.md). runtime/kinds/bound_step.py adds the IO-bound device
variant, runtime/kinds/in_place.py and in_place_device.py the in-place cache (numpy and device
buffers), runtime/kinds/seq2seq.py the generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..config import ModelConfig
from ..errors import BundleError
from ..providers import DISABLED_OPTIMIZERS

Layers = tuple[np.ndarray, ...]  # one (B, H, T, dh) array per decoder layer
# numpy dtypes of the float element types a cache may have (onnxruntime's type strings)
ORT_TO_NUMPY: dict[str, type] = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def input_dtype(session: ort.InferenceSession, name: str) -> type:
    """numpy dtype of float input `name` of `session` (np.float32, or np.float16 for the cache
    of an fp16 graph); BundleError when it has no such input or another element type."""
    types = {arg.name: arg.type for arg in session.get_inputs()}
    if types.get(name) not in ORT_TO_NUMPY:
        raise BundleError(
            f"the graph's input {name!r} is {types.get(name, 'missing')}, not tensor(float) or "
            "tensor(float16); re-export the bundle"
        )
    return ORT_TO_NUMPY[types[name]]


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
        self.max_positions = config.max_positions  # past max_len for positional "relative"
        # bos_id: the token search feeds first (config.start_id, <s> unless the model starts
        # from another token)
        self.bos_id, self.eos_id, self.pad_id = config.start_id, config.eos_id, config.pad_id
        layers = self.layers = config.n_decoder_layers
        # float32, or float16 in an fp16 bundle (cross K/V and cache alike)
        self.cache_dtype = input_dtype(decoder, C.layer_names(C.PAST_K, layers)[0])
        self.encoder_outputs = C.encoder_outputs(layers)
        self.decoder_outputs = C.decoder_outputs(layers)
        fed = (C.PAST_K, C.PAST_V, C.CROSS_K, C.CROSS_V)  # outputs: decoder_outputs
        self.names = {f: C.layer_names(f, layers) for f in fed}
        # k of the graph's search outputs (topk_ids ...; 0: a graph exported before them)
        self.top_width = top_width(decoder)

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

    def empty_cache(self, batch: int) -> Layers:
        """An empty cache: L arrays (B, H, 0, dh) of `cache_dtype` (one shared zero-size
        array)."""
        cfg = self.config
        return (np.zeros((batch, cfg.n_heads, 0, cfg.d_head), self.cache_dtype),) * self.layers

    def start(self, src_ids: np.ndarray) -> OrtState:
        """Run the encoder on src_ids int64 (B, S); empty cache (B, H, 0, dh) per layer."""
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        out = self.encoder.run(list(self.encoder_outputs[1:]), {C.SRC_IDS: src_ids})
        cross_k, cross_v = tuple(out[: self.layers]), tuple(out[self.layers :])
        empty = self.empty_cache(src_ids.shape[0])
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
        (logits,), new_state = self._decoded(state, input_ids, (C.LOGITS,))
        return logits.astype(np.float32, copy=False), new_state

    def step_top(
        self, state: OrtState, input_ids: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray, OrtState]:
        """input_ids int64 (B, N) -> the k (<= top_width) most likely tokens after the last
        new position, from the graph's search outputs: ids int64 (B, k) and log-probabilities
        float64 (B, k), largest first (ties: lower id first); and the extended state. The
        logits stay inside onnxruntime."""
        (ids, logits, lse), new_state = self._decoded(state, input_ids, C.TOP_OUTPUTS)
        return ids[:, :k], top_logprobs(logits[:, :k], lse), new_state

    def _decoded(
        self, state: OrtState, input_ids: np.ndarray, heads: tuple[str, ...]
    ) -> tuple[list[np.ndarray], OrtState]:
        """One decoder run reading outputs `heads` and the cache -> (heads' arrays, state)."""
        names = [*heads, *self.decoder_outputs[1:]]
        out = self.decoder.run(names, self.feeds(state, input_ids))
        layers, first = self.layers, len(heads)
        past_k = tuple(out[first : first + layers])
        past_v = tuple(out[first + layers :])
        new_state = OrtState(
            state.cross_k, state.cross_v, state.src_mask, past_k, past_v, state.source_rows
        )
        return out[:first], new_state

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


def top_width(decoder: ort.InferenceSession) -> int:
    """k of a decoder session's `topk_ids` output [batch, k]; 0 when it has none (or its k
    is not a fixed number)."""
    outputs = {arg.name: arg for arg in decoder.get_outputs()}
    if not C.optional_outputs(set(outputs)):
        return 0
    width = outputs[C.TOPK_IDS].shape[-1]
    return width if isinstance(width, int) else 0


def top_logprobs(topk_logits: np.ndarray, log_normalizer: np.ndarray) -> np.ndarray:
    """Log-probabilities float64 (B, k) of float (B, k) `topk_logits` (largest first) with
    the graph's float (B,) `log_normalizer`, log(sum(exp(logit - max))): logit - max -
    normaliser, the difference exact in float64, so a row's order is its logits' (the one
    rounding of float32 against numpy's float64 log-softmax is the normaliser's, the same
    for every token of the row)."""
    top = topk_logits.astype(np.float64)
    return (top - top[:, :1]) - log_normalizer.astype(np.float64)[:, None]


def _take(arrays: Layers, rows: np.ndarray) -> Layers:
    """Rows `rows` of each array (np.take: a contiguous copy, faster than a[rows])."""
    return tuple(np.take(a, rows, axis=0) for a in arrays)
