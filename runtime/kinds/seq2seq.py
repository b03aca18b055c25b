"""The encoder–decoder kind in the runtime: `encoder.onnx` + `decoder.onnx` (+ the one-graph
search variant), the step models that drive them, and `Seq2SeqGenerator`, which
`Generator.load` returns for such a bundle.

    step_model = OrtStep.from_files("b/encoder.onnx", "b/decoder.onnx", config)
    tokens = greedy_search(step_model, src_ids, max_new_tokens=50)

`OrtStep` keeps the decoder state as numpy arrays (the CPU path). `OrtBoundStep` keeps the
self-attention cache, the cross K/V and the source mask as `OrtValue`s on the session's
device and runs the decoder with IO binding, so on CUDA they stay on the GPU for the whole
generation: present -> past is chained by binding, beam reordering and finished rows leaving
are a Gather on the same device (runtime/device_rows.py), and only the new ids, the row
indices and the search's outputs (top-k ids and scores, or the logits) cross to the host.
Inputs and outputs are fed and read by name (`runtime/constants.py`), never by position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..bundle import Bundle, check_graph_pair
from ..config import ModelConfig
from ..device_rows import DeviceRows, bind_input
from ..errors import BundleError
from ..generator import Generator, OpenOptions
from ..graph_search import GraphSearch
from ..graph_variants import IN_PLACE, SEARCH, graph_variant_path, open_graph_variant
from ..lazy import Lazy
from ..providers import open_sessions
from ..search import GenerationOptions
from ..step import StepModel
from .in_place import InPlaceStep
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


class Seq2SeqGenerator(Generator):
    """An encoder–decoder bundle: the two graphs stepped from Python, or the one-graph
    search variant where `search` allows it (`Generator.uses_graph`). On the CPU, beam search
    on the loop runs the in-place cache decoder when the bundle has one for the variant
    (runtime/kinds/in_place.py); greedy search and sampling run decoder.onnx. Both extra
    graphs are opened on first use (runtime/lazy.py): a server that never runs beam search
    never loads the in-place decoder."""

    _in_place: Lazy[InPlaceStep] | None = None  # the in-place cache step model's opener

    @property
    def in_place(self) -> InPlaceStep | None:
        """The in-place cache step model (opened now if this is its first use), or None."""
        return None if self._in_place is None else self._in_place.get()

    def loop_model(self, options: GenerationOptions) -> StepModel:
        """The in-place cache step model for beam search when the bundle has it, else the
        step model."""
        if options.method == "beam" and self._in_place is not None:
            return self._in_place.get()
        return super().loop_model(options)

    @classmethod
    def open(cls, bundle: Bundle, how: OpenOptions) -> Seq2SeqGenerator:
        """Open the encoder and decoder of `how.variant` (see `Generator.load`); the search
        variant of its precision (unless `how.search` is "loop") and the in-place decoder are
        opened when first used, on the providers and options the two graphs run with."""
        variant, search = how.variant, how.search
        encoder_path, decoder_path = bundle.graphs(variant)
        encoder, decoder, device = open_sessions(
            encoder_path, decoder_path, how.providers, how.threads, how.optimization
        )
        check_graph_pair(bundle, encoder, decoder, variant)
        if device == "cuda":
            step: StepModel = OrtBoundStep(encoder, decoder, bundle.config, "cuda")
        else:
            step = OrtStep(encoder, decoder, bundle.config)
        providers, options = decoder.get_providers(), decoder.get_session_options()

        def opener(key: str) -> Callable[[], ort.InferenceSession] | None:
            if graph_variant_path(bundle, key, variant) is None:
                return None
            return lambda: open_graph_variant(bundle, key, variant, providers, options)

        graph = None
        open_search = opener(SEARCH.key) if search != "loop" else None
        if open_search is not None:
            graph = Lazy(lambda: GraphSearch(open_search(), bundle.config))
        elif search == "graph":
            fix = (
                f"export it with {SEARCH.export_hint(variant)}, or choose"
                if bundle.languages is None
                else "a model with a language list has none (it cannot force the target "
                "language): choose"
            )
            raise BundleError(
                f"{bundle.path} has no one-graph search variant for {variant!r}; {fix} "
                "search 'auto' or 'loop' (--search auto|loop)"
            )
        if search == "graph" and graph is not None:
            graph.get()  # insisted on: a graph that cannot run is refused at load
        generator = cls(bundle, step, device, graph, search)
        open_in_place = opener(IN_PLACE.key)
        if device == "cpu" and open_in_place is not None:
            generator._in_place = Lazy(lambda: InPlaceStep(encoder, open_in_place(), bundle.config))
        return generator


GENERATOR = Seq2SeqGenerator
