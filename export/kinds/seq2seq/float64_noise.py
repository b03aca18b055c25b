"""The model's own float32 error, for parity bounds that follow it: the same computation in
float32 and in float64 (a float64 copy of the PyTorch model), max |Δ|.

    twin = float64_twin(model)
    noise = decoder_noise(model, twin, args)        # one decode_step case, per output family
    bound = noise_bound(noise["logits"])             # TOLERANCE_FP32 + NOISE_FACTOR * noise
    noise = ModelNoise(model, held.sources)          # lazy, for the source and variant groups
    bound_of(diff, noise)                            # {"bound": ...} of a group's fp32 diff

A faithful export differs from PyTorch's float32 by rounding alone: by about as much as
PyTorch's float32 differs from the exact result, which the float64 run stands for, in either
direction, so up to about twice that. On most models that is far below the flat
`TOLERANCE_FP32`; on a model with large activations (a T5 v1.1 with logits in the hundreds)
it is not, and a flat bound would fail an export whose every id is right. The parity levels
and every parity group (the source model's, the steps and in-place decoders') compute the
noise only when an output misses the flat tolerance, so a model within it pays nothing (a
float64 copy doubles the model's memory).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.build_model.torch_step import TorchStep
from edgeseq.runtime import constants as C
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import greedy_search

from ...parity import NOISE_FACTOR, TOLERANCE_FP32, max_abs_diff


def float64_twin(model: Seq2SeqTransformer) -> Seq2SeqTransformer:
    """A float64 copy of `model` (parameters and buffers), in eval mode."""
    return copy.deepcopy(model).double().eval()


def noise_bound(noise: float) -> float:
    """The bound of an output whose float32 error is `noise`."""
    return TOLERANCE_FP32 + NOISE_FACTOR * noise


@torch.no_grad()
def encoder_noise(
    model: Seq2SeqTransformer, twin: Seq2SeqTransformer, src: np.ndarray
) -> dict[str, float]:
    """Per encoder output family (`memory`, `cross_k`, `cross_v`; layers pooled): max |Δ| of
    float32 vs float64 for source ids int64 (B, S)."""
    out, results = {}, []
    for net in (model, twin):
        src_t = torch.from_numpy(src)
        memory = net.encode(src_t, net.source_keep(src_t))
        results.append((memory, *net.cross_kv(memory)))
    (memory32, k32, v32), (memory64, k64, v64) = results
    out[C.MEMORY] = max_abs_diff(memory32.numpy(), memory64.numpy())
    out[C.CROSS_K] = max(max_abs_diff(a.numpy(), b.numpy()) for a, b in zip(k32, k64, strict=True))
    out[C.CROSS_V] = max(max_abs_diff(a.numpy(), b.numpy()) for a, b in zip(v32, v64, strict=True))
    return out


@torch.no_grad()
def decoder_noise(
    model: Seq2SeqTransformer,
    twin: Seq2SeqTransformer,
    args: Sequence[torch.Tensor | tuple[torch.Tensor, ...]],
) -> dict[str, float]:
    """Per decoder output family (`logits`, `present_k`, `present_v`; layers pooled): max |Δ|
    of float32 vs float64 for `decode_step`'s float32 arguments `args` (ids, past K, past V,
    cross K, cross V, source mask), upcast for the float64 run."""

    def upcast(arg: torch.Tensor | tuple[torch.Tensor, ...]) -> object:
        if isinstance(arg, tuple):
            return tuple(upcast(a) for a in arg)
        return arg.double() if arg.is_floating_point() else arg

    logits32, k32, v32 = model.decode_step(*args)
    logits64, k64, v64 = twin.decode_step(*(upcast(a) for a in args))
    pairs = {
        C.LOGITS: [(logits32, logits64)],
        C.PRESENT_K: list(zip(k32, k64, strict=True)),
        C.PRESENT_V: list(zip(v32, v64, strict=True)),
    }
    return {
        family: max(max_abs_diff(a.numpy(), b.numpy()) for a, b in tensors)
        for family, tensors in pairs.items()
    }


@torch.no_grad()
def logits_noise(
    model: Seq2SeqTransformer,
    twin: Seq2SeqTransformer,
    src: np.ndarray,
    tgt_in: np.ndarray,
    real: np.ndarray,
) -> float:
    """max |Δ| of float32 vs float64 uncached decoder logits of sources int64 (B, S) and
    target prefixes int64 (B, T) (from the start token), at the (B, T) bool `real`
    positions."""
    logits = []
    for net in (model, twin):
        src_t = torch.from_numpy(src)
        keep = net.source_keep(src_t)
        memory = net.encode(src_t, keep)
        logits.append(net.decode(torch.from_numpy(tgt_in), memory, keep).numpy()[real])
    return max_abs_diff(logits[0], logits[1])


NOISE_ROWS = 8  # held-out inputs of `ModelNoise.along_greedy`
NOISE_STEPS = 32


class ModelNoise:
    """One model's float32 logits error, measured when a parity group first needs it (a
    model within the flat tolerance never builds the float64 twin).

        noise = ModelNoise(model, held.sources)
        noise.at(src, tgt_in, real)     # on the positions a group compared
        noise.along_greedy()            # on a greedy decode of the first NOISE_ROWS sources

    The extra graphs' groups (steps, inplace) compare two onnxruntime graphs, each about this
    far from the exact result; the source group compares the graphs with the source model,
    whose float32 arithmetic is the same function's."""

    def __init__(self, model: Seq2SeqTransformer, sources: Sequence[Sequence[int]]) -> None:
        self.model = model
        self.sources = [list(s) for s in sources[:NOISE_ROWS]]
        self._twin: Seq2SeqTransformer | None = None
        self._greedy: float | None = None

    @property
    def twin(self) -> Seq2SeqTransformer:
        """The float64 copy, built on first use."""
        if self._twin is None:
            self._twin = float64_twin(self.model)
        return self._twin

    def at(self, src: np.ndarray, tgt_in: np.ndarray, real: np.ndarray) -> float:
        """`logits_noise` of sources int64 (B, S) and target prefixes int64 (B, T) at the
        (B, T) bool `real` positions."""
        return logits_noise(self.model, self.twin, src, tgt_in, real)

    def along_greedy(self) -> float:
        """`logits_noise` along PyTorch's greedy decode (up to NOISE_STEPS tokens, each row up
        to its `</s>`) of the first NOISE_ROWS sources; measured once."""
        if self._greedy is None:
            cfg = self.model.cfg
            src = right_pad(self.sources, cfg.pad_id)
            steps = min(NOISE_STEPS, cfg.max_len)
            decoded = greedy_search(TorchStep(self.model), src, steps)
            fed = [[cfg.start_id, *ids][:steps] for ids in decoded]
            tgt_in = right_pad(fed, cfg.pad_id)
            real = np.arange(tgt_in.shape[1])[None, :] < np.array([len(f) for f in fed])[:, None]
            self._greedy = self.at(src, tgt_in, real)
        return self._greedy


def bound_of(diff: float, noise: ModelNoise | None, measure: str = "logits") -> dict[str, float]:
    """The bound of a group's fp32 `diff` vs TOLERANCE_FP32 and, past it, `noise`'s greedy
    logits error: {"bound": ...} plus, when measured, {"float64_noise", "noise_factor"}.
    `measure` "scores": a length-normalised log-probability (length_penalty 1), which moves
    by at most twice the logits' error."""
    if diff <= TOLERANCE_FP32 or noise is None:
        return {"bound": TOLERANCE_FP32}
    error = noise.along_greedy()
    scale = 2.0 if measure == "scores" else 1.0
    return {
        "bound": TOLERANCE_FP32 + scale * NOISE_FACTOR * error,
        "float64_noise": error,
        "noise_factor": NOISE_FACTOR,
    }
