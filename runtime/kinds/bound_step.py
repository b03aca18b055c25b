"""The encoder–decoder's step model with its decoder state on the session's device (the GPU
path of the two-graph loop; runtime/kinds/ort_step.py is the numpy one).

    step_model = OrtBoundStep(encoder_session, decoder_session, config, "cuda")
    tokens = greedy_search(step_model, src_ids, max_new_tokens=50)

`OrtBoundStep` keeps the self-attention cache, the cross K/V and the source mask as
`OrtValue`s on the session's device and runs the decoder with IO binding, so on CUDA they stay
on the GPU for the whole generation: present -> past is chained by binding, beam reordering
and finished rows leaving are a Gather on the same device (runtime/device_rows.py), and only
the new ids, the row indices and the search's outputs (top-k ids and scores, or the logits)
cross to the host. The same code runs on the CPU provider with CPU OrtValues (the tests).
runtime/kinds/in_place_device.py builds the in-place cache decoder on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..config import ModelConfig
from ..device_rows import DeviceRows, bind_input
from .ort_step import Layers, OrtStep

Values = tuple[ort.OrtValue, ...]  # one (B, H, T, dh) OrtValue per decoder layer


@dataclass
class OrtBoundState:
    """Decoder state as OrtValues on the device: cross K/V and cache, L-tuples of
    (B, H, *, dh), and src_mask (B, S) bool; source_rows (B,) int64 on the host, the encoder
    row each state row came from (as `OrtState`'s). The empty cache of a new state is host
    arrays (B, H, 0, dh): onnxruntime copies their zero bytes in, and never has to allocate
    an empty device buffer."""

    cross_k: Values
    cross_v: Values
    src_mask: ort.OrtValue
    past_k: Values | Layers
    past_v: Values | Layers
    source_rows: np.ndarray

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.src_mask.shape()[0])

    @property
    def past_len(self) -> int:
        """Target positions already cached."""
        past = self.past_k[0]
        return int(past.shape[2] if isinstance(past, np.ndarray) else past.shape()[2])


class OrtBoundStep(OrtStep):
    """OrtStep whose state lives on `device_type` ("cuda", or "cpu" for testing) and whose
    runs use IO binding. Row selection (finished rows leaving, beam reordering) gathers on
    the device: the cache always, the cross K/V and mask only when rows change source."""

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        config: ModelConfig,
        device_type: str = "cuda",
        device_id: int = 0,
    ) -> None:
        super().__init__(encoder, decoder, config)
        self.device_type, self.device_id = device_type, device_id
        self.rows = DeviceRows.like(decoder, device_type, device_id)

    def to_device(self, array: np.ndarray) -> ort.OrtValue:
        """Copy a numpy array to an OrtValue on this step's device."""
        return ort.OrtValue.ortvalue_from_numpy(
            np.ascontiguousarray(array), self.device_type, self.device_id
        )

    def start(self, src_ids: np.ndarray) -> OrtBoundState:  # type: ignore[override]
        """Run the encoder on src_ids int64 (B, S); cross K/V stay on the device."""
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        binding = self.encoder.io_binding()
        binding.bind_cpu_input(C.SRC_IDS, src_ids)
        for name in self.encoder_outputs[1:]:
            binding.bind_output(name, self.device_type, self.device_id)
        self.encoder.run_with_iobinding(binding)
        out = binding.get_outputs()  # in binding order
        cross_k, cross_v = tuple(out[: self.layers]), tuple(out[self.layers :])
        batch = src_ids.shape[0]
        empty = self.empty_cache(batch)
        src_mask = self.to_device(src_ids != self.pad_id)
        return OrtBoundState(cross_k, cross_v, src_mask, empty, empty, np.arange(batch))

    def _decoded(  # type: ignore[override]
        self, state: OrtBoundState, input_ids: np.ndarray, heads: tuple[str, ...]
    ) -> tuple[list[np.ndarray], OrtBoundState]:
        """`step` and `step_top` (OrtStep's): input_ids int64 (B, N) -> outputs `heads` on
        the host (the logits or the search's outputs: only those leave the device) and the
        extended state, whose cache stays on the device."""
        binding = self.decoder.io_binding()
        binding.bind_cpu_input(C.INPUT_IDS, np.ascontiguousarray(input_ids, dtype=np.int64))
        binding.bind_ortvalue_input(C.SRC_MASK, state.src_mask)
        for family, values in (
            (C.PAST_K, state.past_k),
            (C.PAST_V, state.past_v),
            (C.CROSS_K, state.cross_k),
            (C.CROSS_V, state.cross_v),
        ):
            for name, value in zip(self.names[family], values, strict=True):
                bind_input(binding, name, value)
        for name in heads:
            binding.bind_output(name, "cpu")  # what the search reads, on the host
        for name in self.decoder_outputs[1:]:
            binding.bind_output(name, self.device_type, self.device_id)
        self.decoder.run_with_iobinding(binding)
        out = binding.get_outputs()  # in binding order
        layers, first = self.layers, len(heads)
        past_k, past_v = tuple(out[first : first + layers]), tuple(out[first + layers :])
        new_state = OrtBoundState(
            state.cross_k, state.cross_v, state.src_mask, past_k, past_v, state.source_rows
        )
        return [value.numpy() for value in out[:first]], new_state

    def select(self, state: OrtBoundState, rows: np.ndarray) -> OrtBoundState:  # type: ignore[override]
        """Gather batch rows (int64 (B',), may repeat) on the device. Beam reordering within
        each input keeps the cross K/V and mask as they are (see `OrtStep.select`)."""
        rows = np.asarray(rows, dtype=np.int64)
        if np.array_equal(rows, np.arange(state.batch)):
            return state
        source_rows = state.source_rows[rows]
        cross_k, cross_v, src_mask = state.cross_k, state.cross_v, state.src_mask
        if not np.array_equal(source_rows, state.source_rows):
            *cross, src_mask = self.rows.gather([*cross_k, *cross_v, src_mask], rows)
            cross_k, cross_v = tuple(cross[: self.layers]), tuple(cross[self.layers :])
        if state.past_len == 0:  # the empty cache stays on the host (see OrtBoundState)
            empty = self.empty_cache(len(rows))
            return OrtBoundState(cross_k, cross_v, src_mask, empty, empty, source_rows)
        past = self.rows.gather([*state.past_k, *state.past_v], rows)  # type: ignore[list-item]
        past_k, past_v = tuple(past[: self.layers]), tuple(past[self.layers :])
        return OrtBoundState(cross_k, cross_v, src_mask, past_k, past_v, source_rows)
