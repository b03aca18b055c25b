"""The encoder–decoder kind in the runtime: `encoder.onnx` + `decoder.onnx` (+ the one-graph
search variant), the step models that drive them, and `Seq2SeqGenerator`, which
`Generator.load` returns for such a bundle.

    step_model = OrtStep.from_files("b/encoder.onnx", "b/decoder.onnx", config)
    tokens = greedy_search(step_model, src_ids, max_new_tokens=50)

`OrtStep` keeps the decoder state as numpy arrays (the CPU path, runtime/kinds/ort_step.py).
`OrtBoundStep` keeps it as `OrtValue`s on the session's device (runtime/kinds/bound_step.py),
so on CUDA it stays on the GPU for the whole generation. Beam search on the loop runs the
in-place cache decoder where the bundle has it: `InPlaceStep` on the CPU
(runtime/kinds/in_place.py), `InPlaceDeviceStep` on CUDA (runtime/kinds/in_place_device.py).
Inputs and outputs are fed and read by name (`runtime/constants.py`), never by position.
"""

from __future__ import annotations

from collections.abc import Callable

import onnxruntime as ort

from ..bundle import Bundle, check_graph_pair
from ..config import ModelConfig
from ..errors import BundleError
from ..generator import Generator, OpenOptions
from ..graph_search import GraphSearch
from ..graph_variants import IN_PLACE, SEARCH, graph_variant_path, open_graph_variant
from ..lazy import Lazy
from ..providers import open_sessions
from ..search import GenerationOptions
from ..step import StepModel
from .bound_step import OrtBoundStep
from .in_place import InPlaceStep
from .in_place_device import InPlaceDeviceStep, runs_on_cuda
from .ort_step import OrtStep


class Seq2SeqGenerator(Generator):
    """An encoder–decoder bundle: the two graphs stepped from Python, or the one-graph
    search variant where `search` allows it (`Generator.uses_graph`). Beam search on the loop
    runs the in-place cache decoder when the bundle has one for the variant: on the CPU with
    numpy buffers (runtime/kinds/in_place.py), on CUDA with its buffers on the GPU
    (runtime/kinds/in_place_device.py; heads of 32, 64 or 128 values only, else decoder.onnx);
    greedy search and sampling run decoder.onnx. Both extra graphs are opened on first use
    (runtime/lazy.py): a server that never runs beam search never loads the in-place
    decoder."""

    # the in-place cache step model's opener
    _in_place: Lazy[InPlaceStep | InPlaceDeviceStep] | None = None

    @property
    def in_place(self) -> InPlaceStep | InPlaceDeviceStep | None:
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
        if open_in_place is not None:
            generator._in_place = _in_place_opener(encoder, open_in_place, bundle.config, device)
        return generator


def _in_place_opener(
    encoder: ort.InferenceSession,
    open_decoder: Callable[[], ort.InferenceSession],
    config: ModelConfig,
    device: str,
) -> Lazy[InPlaceStep | InPlaceDeviceStep] | None:
    """The in-place cache step model for `device`, made on first use: numpy buffers on the
    CPU (faster there), device buffers on CUDA where its kernel takes the model's heads;
    None where it does not run."""
    if device == "cpu":
        return Lazy(lambda: InPlaceStep(encoder, open_decoder(), config))
    if device == "cuda" and runs_on_cuda(config):
        return Lazy(lambda: InPlaceDeviceStep(encoder, open_decoder(), config, "cuda"))
    return None


GENERATOR = Seq2SeqGenerator
