"""The encoder–decoder kind in the runtime: `encoder.onnx` + `decoder.onnx` (+ the one-graph
search variant), the step models that drive them, and `Seq2SeqGenerator`, which
`Generator.load` returns for such a bundle.

    step_model = OrtStep.from_files("b/encoder.onnx", "b/decoder.onnx", config)
    tokens = greedy_search(step_model, src_ids, max_new_tokens=50)

`OrtStep` keeps the decoder state as numpy arrays (the CPU path). `OrtBoundStep` keeps the
self-attention cache and the cross K/V as `OrtValue`s on the session's device and runs the
decoder with IO binding, so on CUDA they stay on the GPU between steps; only the new ids go
in and the logits come out each step. Inputs and outputs are fed and read by name
(`runtime/constants.py`), never by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..bundle import Bundle, check_graph_pair
from ..config import ModelConfig
from ..errors import BundleError
from ..generator import Generator, OpenOptions
from ..graph_search import GraphSearch
from ..providers import DISABLED_OPTIMIZERS, open_sessions, session_options
from ..step import StepModel

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
        source_rows = state.source_rows[rows]

        def take(arrays: Layers) -> Layers:  # np.take: a contiguous copy, faster than a[rows]
            return tuple(np.take(a, rows, axis=0) for a in arrays)

        if np.array_equal(source_rows, state.source_rows):
            cross_k, cross_v, src_mask = state.cross_k, state.cross_v, state.src_mask
        else:
            cross_k, cross_v = take(state.cross_k), take(state.cross_v)
            src_mask = np.take(state.src_mask, rows, axis=0)
        return OrtState(
            cross_k, cross_v, src_mask, take(state.past_k), take(state.past_v), source_rows
        )


Values = tuple[ort.OrtValue, ...]  # one (B, H, T, dh) OrtValue per decoder layer


@dataclass
class OrtBoundState:
    """Decoder state as OrtValues on the device: cross K/V and cache, L-tuples of
    (B, H, *, dh), and src_mask (B, S) bool. The empty cache of a new state is host arrays
    (B, H, 0, dh): onnxruntime copies their zero bytes in, and never has to allocate an empty
    device buffer."""

    cross_k: Values
    cross_v: Values
    src_mask: ort.OrtValue
    past_k: Values | Layers
    past_v: Values | Layers

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
    runs use IO binding. Row selection (finished rows leaving, beam reordering) copies the
    state to the host and back: OrtValue has no device-side gather."""

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
        empty = self.empty_cache(src_ids.shape[0], _numpy_dtype(cross_k[0]))
        return OrtBoundState(cross_k, cross_v, self.to_device(src_ids != self.pad_id), empty, empty)

    def step(  # type: ignore[override]
        self, state: OrtBoundState, input_ids: np.ndarray
    ) -> tuple[np.ndarray, OrtBoundState]:
        """input_ids int64 (B, N) -> logits float32 (B, N, V) on the host and the extended
        state, whose cache stays on the device."""
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
                if isinstance(value, np.ndarray):
                    binding.bind_cpu_input(name, value)
                else:
                    binding.bind_ortvalue_input(name, value)
        binding.bind_output(C.LOGITS, "cpu")  # the search needs the logits on the host
        for name in self.decoder_outputs[1:]:
            binding.bind_output(name, self.device_type, self.device_id)
        self.decoder.run_with_iobinding(binding)
        out = binding.get_outputs()  # in binding order
        layers = self.layers
        past_k, past_v = tuple(out[1 : 1 + layers]), tuple(out[1 + layers :])
        new_state = OrtBoundState(state.cross_k, state.cross_v, state.src_mask, past_k, past_v)
        return out[0].numpy().astype(np.float32, copy=False), new_state

    def select(self, state: OrtBoundState, rows: np.ndarray) -> OrtBoundState:  # type: ignore[override]
        """Gather batch rows (int64 (B',), may repeat) through a host round-trip."""
        rows = np.asarray(rows, dtype=np.int64)
        if np.array_equal(rows, np.arange(state.batch)):
            return state

        def take(values: Values | Layers) -> Values | Layers:
            taken = [_host(v)[rows] for v in values]
            if taken[0].shape[2] == 0:  # an empty cache stays on the host (see OrtBoundState)
                return tuple(np.ascontiguousarray(t) for t in taken)
            return tuple(self.to_device(t) for t in taken)

        return OrtBoundState(
            take(state.cross_k),  # type: ignore[arg-type]
            take(state.cross_v),  # type: ignore[arg-type]
            self.to_device(state.src_mask.numpy()[rows]),
            take(state.past_k),
            take(state.past_v),
        )


ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def _numpy_dtype(value: ort.OrtValue) -> type:
    """numpy dtype of a float OrtValue (float32 or float16)."""
    return ORT_TO_NUMPY.get(value.data_type(), np.float32)


def _host(value: ort.OrtValue | np.ndarray) -> np.ndarray:
    """A numpy array of `value` (copied from the device when it is an OrtValue there)."""
    return value if isinstance(value, np.ndarray) else value.numpy()


class Seq2SeqGenerator(Generator):
    """An encoder–decoder bundle: the two graphs stepped from Python, or the one-graph
    search variant where `search` allows it (`Generator.uses_graph`)."""

    @classmethod
    def open(cls, bundle: Bundle, how: OpenOptions) -> Seq2SeqGenerator:
        """Open the encoder and decoder of `how.variant` (see `Generator.load`), and the
        search variant of its precision unless `how.search` is "loop"."""
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
        graph = None
        if search != "loop":
            precision = variant if variant in C.SEARCH_FILES else None  # fp16: none
            options = session_options(how.threads, how.optimization)
            graph = (  # on the providers the two graphs really run on
                GraphSearch.open(bundle, precision, encoder.get_providers(), options)
                if precision
                else None
            )
            if graph is None and search == "graph":
                raise BundleError(
                    f"{bundle.path} has no one-graph search variant for {variant!r}; export "
                    "it with edgeseq export --variants fp32,search (plus int8 or ort for "
                    "those), or choose search 'auto' or 'loop' (--search auto|loop)"
                )
        return cls(bundle, step, device, graph, search)


GENERATOR = Seq2SeqGenerator
