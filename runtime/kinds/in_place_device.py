"""The in-place cache decoder (`decoder.inplace.onnx`, runtime/kinds/in_place.py) with its
buffers on the session's device: each layer's key and value buffer (B, H, M, dh), the cross
K/V and the source mask are `OrtValue`s on `device_type` ("cuda", or "cpu" for the tests),
bound as the decoder's inputs (each buffer as both past and present) and never copied to
the host. Per step only the new token ids, the attended-length mask, the position and the
small int32 cache indirection go to the device, and only the search's outputs come back.

    step_model = InPlaceDeviceStep(encoder, decoder, config, "cuda")  # decoder.inplace.onnx
    hyps = search(step_model, src_ids, GenerationOptions(beam_size=4))

The contract is `InPlaceStep`'s: states are used once (`step` and `select` return the state
to use next; stepping or selecting a spent state raises ValueError), a new generation's
buffers hold max(64, 2 S) positions (at most max_len) and grow by doubling, and a step at
position max_len raises `CacheFullError`. The buffers' element type is the decoder's
`past_k.0` input's (float32, or float16 for a graph that takes a float16 cache).

`select` (runtime/kinds/indirection.py) moves nothing for beam reordering inside blocks (the
host-side indirection table changes); other selections are small graphs on the decoder's
provider (runtime/device_rows.py): whole blocks kept (finished inputs leave) and rows whose
positions all come from one old row are a row `Gather` of the buffers (and of the cross K/V
and mask when rows change source); anything else reads every row's positions through the
indirection into new buffers (`DeviceRows.resolve`). Growth is a `Pad` of the columns.
There is no buffer pool: freed device buffers go back to onnxruntime's allocator (on CUDA
its arena), which reuses them.

On CUDA onnxruntime's `DecoderMaskedMultiHeadAttention` kernel takes heads of 32, 64 or 128
values only (`CUDA_HEAD_SIZES`); `runs_on_cuda` says whether a model's decoder can run there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..config import ModelConfig
from ..device_rows import ELEMENT_TYPES
from .bound_step import OrtBoundStep, Values
from .in_place import cache_length, check_one_token, per_input_cross
from .indirection import (
    check_live,
    check_room,
    cross_rows,
    grown_indirection,
    mark_written,
    plan_select,
)

CUDA_HEAD_SIZES = (32, 64, 128)  # head sizes onnxruntime's CUDA kernel of the in-place op has


def runs_on_cuda(config: ModelConfig) -> bool:
    """Whether the in-place decoder of a model of `config` runs on onnxruntime's CUDA
    provider (its attention heads have a size the CUDA kernel has)."""
    return config.d_head in CUDA_HEAD_SIZES


@dataclass
class InPlaceDeviceState:
    """Cross K/V, L-tuples of (C, H, S, dh), src_mask (C, S) bool (C = B / width rows, one
    per block, for a decoder that takes them per input, else C = B) and the cache buffers,
    L-tuples of (B, H, M, dh) with `past` positions filled: OrtValues on the device;
    source_rows int64 (B,) (the encoder row of each row, `OrtState`'s) and `indirection`
    int32 (B / width, width, M) on the host; `width` rows per block."""

    cross_k: Values
    cross_v: Values
    src_mask: ort.OrtValue
    source_rows: np.ndarray
    cache_k: Values
    cache_v: Values
    past: int
    width: int
    indirection: np.ndarray
    # The decoder's IO binding with the values above bound; None until the first step after
    # a change of values.
    binding: ort.IOBinding | None = None
    spent: bool = False  # passed to step or select, which returned the state to use instead

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return len(self.source_rows)

    @property
    def past_len(self) -> int:
        """Target positions already cached."""
        return self.past

    @property
    def cache_len(self) -> int:
        """Positions the buffers hold."""
        return int(self.cache_k[0].shape()[2])


class InPlaceDeviceStep(OrtBoundStep):
    """`OrtBoundStep` (the encoder writing the cross K/V on the device, `DeviceRows` on the
    decoder's provider) whose decoder is the in-place cache graph; see the module docstring."""

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        config: ModelConfig,
        device_type: str = "cuda",
        device_id: int = 0,
    ) -> None:
        super().__init__(encoder, decoder, config, device_type, device_id)
        self.names[C.PRESENT_K] = C.layer_names(C.PRESENT_K, self.layers)
        self.names[C.PRESENT_V] = C.layer_names(C.PRESENT_V, self.layers)
        self.per_input = per_input_cross(decoder)
        inputs = {arg.name: arg.type for arg in decoder.get_inputs()}
        # ONNX element type of the buffers: the decoder's cache input's
        self.cache_element_type = ELEMENT_TYPES[inputs[self.names[C.PAST_K][0]]]

    def buffers(self, rows: int, length: int) -> Values:
        """L new buffers (rows, H, length, dh) on the device (contents undefined)."""
        shape = [rows, self.config.n_heads, length, self.config.d_head]
        return tuple(
            ort.OrtValue.ortvalue_from_shape_and_type(
                shape, self.cache_element_type, self.device_type, self.device_id
            )
            for _ in range(self.layers)
        )

    def start(self, src_ids: np.ndarray) -> InPlaceDeviceState:  # type: ignore[override]
        """Run the encoder on src_ids int64 (B, S) (cross K/V stay on the device); empty
        buffers of `cache_length` positions, one row per block."""
        first = super().start(src_ids)
        rows, length = first.batch, cache_length(self.max_positions, src_ids.shape[1])
        return InPlaceDeviceState(
            first.cross_k, first.cross_v, first.src_mask, first.source_rows,
            self.buffers(rows, length), self.buffers(rows, length), 0, 1,
            np.zeros((rows, 1, length), np.int32),
        )  # fmt: skip

    def grown(self, state: InPlaceDeviceState) -> InPlaceDeviceState:
        """`state` with buffers twice as long (at most max_len): the new columns are zeros
        (a `Pad` on the device)."""
        length = min(self.max_positions, 2 * state.cache_len)
        cache = self.rows.pad([*state.cache_k, *state.cache_v], width=length)
        indirection = grown_indirection(state.indirection, state.past, length)
        source = (state.cross_k, state.cross_v, state.src_mask, state.source_rows)
        return self._moved(source, cache, state.width, indirection, state)

    def _moved(
        self,
        source: tuple[Values, Values, ort.OrtValue, np.ndarray],
        cache: Values,
        width: int,
        indirection: np.ndarray,
        state: InPlaceDeviceState,
    ) -> InPlaceDeviceState:
        """A state after `state` (now spent): cross K/V, src_mask and source_rows `source`,
        buffers `cache` (L keys then L values). The spent state's binding goes, so the
        values only it held are freed with it."""
        layers = self.layers
        moved = InPlaceDeviceState(
            *source, cache[:layers], cache[layers:], state.past, width, indirection
        )
        state.spent, state.binding = True, None
        return moved

    def bind(self, state: InPlaceDeviceState) -> ort.IOBinding:
        """A decoder IO binding of the inputs that stay the same from step to step: cross
        K/V, src_mask, beam_width, and each buffer as past (the outputs are bound per step)."""
        binding = self.decoder.io_binding()
        for family, values in (
            (C.CROSS_K, state.cross_k),
            (C.CROSS_V, state.cross_v),
            (C.PAST_K, state.cache_k),
            (C.PAST_V, state.cache_v),
        ):
            for name, value in zip(self.names[family], values, strict=True):
                binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_input(C.SRC_MASK, state.src_mask)
        binding.bind_cpu_input(C.BEAM_WIDTH, np.array([state.width], np.int32))
        return binding

    def _decoded(  # type: ignore[override]
        self, state: InPlaceDeviceState, input_ids: np.ndarray, heads: tuple[str, ...]
    ) -> tuple[list[np.ndarray], InPlaceDeviceState]:
        """`step` and `step_top` (OrtStep's) on input_ids int64 (B, 1): outputs `heads` on the
        host (only those leave the device), and the state with position past_len written
        into its buffers (the same buffers, unless they had to grow)."""
        check_one_token(input_ids)
        check_live(state)
        try:
            check_room(state.past, self.max_positions)
            if state.past >= state.cache_len:
                state = self.grown(state)
            return self._run(state, input_ids, heads)
        except BaseException:
            state.spent, state.binding = True, None
            raise

    def _run(
        self, state: InPlaceDeviceState, input_ids: np.ndarray, heads: tuple[str, ...]
    ) -> tuple[list[np.ndarray], InPlaceDeviceState]:
        """`_decoded` once the buffers have room for position past_len: outputs `heads` are
        bound to the host, each buffer as its own present (written in place), the other
        outputs not at all (the logits, when not read, stay inside onnxruntime)."""
        if state.binding is None:
            state.binding = self.bind(state)
        binding, past, rows = state.binding, state.past, state.batch
        binding.bind_cpu_input(C.INPUT_IDS, np.ascontiguousarray(input_ids, dtype=np.int64))
        binding.bind_cpu_input(C.CACHE_MASK, np.ones((rows, past + 1), np.int32))
        binding.bind_cpu_input(C.PAST_LENGTH, np.array([past], np.int32))
        binding.bind_cpu_input(C.CACHE_INDIRECTION, state.indirection)
        binding.clear_binding_outputs()  # the heads read may change from one step to the next
        for name in heads:
            binding.bind_output(name, "cpu")
        for present, values in ((C.PRESENT_K, state.cache_k), (C.PRESENT_V, state.cache_v)):
            for name, value in zip(self.names[present], values, strict=True):
                binding.bind_ortvalue_output(name, value)
        self.decoder.run_with_iobinding(binding)
        out = binding.get_outputs()[: len(heads)]  # in binding order
        mark_written(state.indirection, past)
        state.past = past + 1
        return [value.numpy() for value in out], state

    def select(self, state: InPlaceDeviceState, rows: np.ndarray) -> InPlaceDeviceState:  # type: ignore[override]
        """Gather batch rows (int64 (B',), may repeat); see the module docstring."""
        check_live(state)
        try:
            return self._select(state, np.asarray(rows, dtype=np.int64))
        except BaseException:
            state.spent, state.binding = True, None
            raise

    def _select(self, state: InPlaceDeviceState, rows: np.ndarray) -> InPlaceDeviceState:
        """`select` on a live state."""
        plan = plan_select(state.indirection, state.width, state.past, rows)
        buffers = [*state.cache_k, *state.cache_v]
        if plan.kind == "reorder":  # the table only: values and binding stay
            outer = (state.cross_k, state.cross_v, state.src_mask, state.source_rows)
            binding = state.binding
            moved = self._moved(outer, tuple(buffers), plan.width, plan.indirection, state)
            moved.binding = binding
            return moved
        if plan.source is not None:  # whole blocks kept: one row each
            return self._gathered(state, plan.source, rows, plan.width, plan.indirection)
        assert plan.held is not None
        if state.past == 0:  # nothing written yet: new buffers
            outer = self._outer(state, rows, plan.width)
            count, length = len(rows), state.cache_len
            cache = self.buffers(count, length) + self.buffers(count, length)  # keys, values
            return self._moved(outer, cache, plan.width, plan.indirection, state)
        if (plan.held == plan.held[:, :1]).all():  # each row's positions in one old row
            return self._gathered(state, plan.held[:, 0], rows, plan.width, plan.indirection)
        outer = self._outer(state, rows, plan.width)
        cache = self.rows.resolve(buffers, plan.held)
        return self._moved(outer, cache, plan.width, plan.indirection, state)

    def _outer(
        self, state: InPlaceDeviceState, rows: np.ndarray, width: int
    ) -> tuple[Values, Values, ort.OrtValue, np.ndarray]:
        """Cross K/V, src_mask and source_rows of batch rows `rows` (B',) in blocks of `width`
        (`cross_rows`): the same values when every cross row keeps its source, else gathered
        on the device."""
        source_rows = state.source_rows[rows]
        kept = cross_rows(state.source_rows, state.width, rows, width, self.per_input)
        if kept is None:
            return state.cross_k, state.cross_v, state.src_mask, source_rows
        *cross, src_mask = self.rows.gather([*state.cross_k, *state.cross_v, state.src_mask], kept)
        layers = self.layers
        return tuple(cross[:layers]), tuple(cross[layers:]), src_mask, source_rows

    def _gathered(
        self,
        state: InPlaceDeviceState,
        buffer_rows: np.ndarray,
        rows: np.ndarray,
        width: int,
        indirection: np.ndarray,
    ) -> InPlaceDeviceState:
        """The state of batch rows `rows` (B',) whose buffers are the old buffers' rows
        `buffer_rows` (B',), each in the same block as the row of `rows` in its place (so of
        the same source row): one `Gather` for the buffers and, when rows change source, the
        cross K/V and mask (in the same graph when they hold one row per row)."""
        buffers = [*state.cache_k, *state.cache_v]
        kept = cross_rows(state.source_rows, state.width, rows, width, self.per_input)
        if kept is None or self.per_input:
            cache = self.rows.gather(buffers, buffer_rows)
            outer = self._outer(state, rows, width)
            return self._moved(outer, cache, width, indirection, state)
        sources = [*state.cross_k, *state.cross_v, state.src_mask]
        *gathered, src_mask = self.rows.gather([*buffers, *sources], buffer_rows)
        cache, cross = tuple(gathered[: len(buffers)]), gathered[len(buffers) :]
        layers = self.layers
        outer = (tuple(cross[:layers]), tuple(cross[layers:]), src_mask, state.source_rows[rows])
        return self._moved(outer, cache, width, indirection, state)
