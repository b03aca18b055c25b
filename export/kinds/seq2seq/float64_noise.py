"""The model's own float32 error, for parity bounds that follow it: the same computation in
float32 and in float64 (a float64 copy of the PyTorch model), max |Δ|.

    twin = float64_twin(model)
    noise = decoder_noise(model, twin, args)        # one decode_step case, per output family
    bound = noise_bound(noise["logits"])             # TOLERANCE_FP32 + NOISE_FACTOR * noise

A faithful export differs from PyTorch's float32 by rounding alone: by about as much as
PyTorch's float32 differs from the exact result, which the float64 run stands for, in either
direction, so up to about twice that. On most models that is far below the flat
`TOLERANCE_FP32`; on a model with large activations (a T5 v1.1 with logits in the hundreds)
it is not, and a flat bound would fail an export whose every id is right. The parity levels
compute the noise only when an output misses the flat tolerance, so a model within it pays
nothing (a float64 copy doubles the model's memory).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C

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
