"""Parity level 1, per graph: every output of both graphs vs PyTorch over grids of shapes.

    report = level1_graphs(model, engine)   # engine: OrtStep over the exported graphs
    report["max_abs_diff"]["logits"]        # worst |Δ| of that output family

The encoder runs over batch x src_len, the decoder over batch x src_len x past_len x new_len
(past_len 0 and batch 1 included), fed cross and past K/V that PyTorch computed from random
ids, so every input is a state the model really makes. An output family is within
TOLERANCE_FP32, or else within the bound of PyTorch's own float32 error on the same cases
(float64_noise.py), measured only then.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.kinds.seq2seq import OrtStep

from ...parity import NOISE_FACTOR, TOLERANCE_FP32, max_abs_diff
from .float64_noise import decoder_noise, encoder_noise, float64_twin, noise_bound

LEVEL1_BATCHES = (1, 3)
LEVEL1_SRC_LENS = (1, 7, 23)
LEVEL1_PAST_LENS = (0, 1, 9)
LEVEL1_NEW_LENS = (1, 4)


def _random_mask(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    """(B, S) bool: row 0 fully real, other rows real up to a random length >= 1."""
    lengths = rng.integers(1, length + 1, size=batch)
    lengths[0] = length
    return np.arange(length)[None, :] < lengths[:, None]


# -- level 1 ---------------------------------------------------------------------------------
def decoder_feeds(
    model: Seq2SeqTransformer,
    rng: np.random.Generator,
    batch: int,
    src_len: int,
    past_len: int,
    new_len: int,
) -> dict[str, np.ndarray]:
    """Decoder-graph inputs for one level-1 case, as the model itself would produce them.

    Random source ids (rows padded to random lengths) give the cross K/V through PyTorch's
    encoder; random target ids, fed through PyTorch's decoder from an empty cache, give the
    past K/V (past_len 0: an empty cache); then new_len random target ids. Unit-normal K/V
    would be out of the model's range: a trained model's queries against them give Q·Kᵀ in
    the thousands, where onnxruntime's and PyTorch's fp32 roundings differ by more than the
    tolerance with no error in the graph."""
    cfg, first = model.cfg, len(C.SPECIAL_TOKENS)
    keep = _random_mask(rng, batch, src_len)
    src = np.where(keep, rng.integers(first, cfg.src_vocab_size, (batch, src_len)), cfg.pad_id)
    prefix = rng.integers(first, cfg.tgt_vocab_size, (batch, past_len))
    with torch.no_grad():
        keep_t = torch.from_numpy(keep)
        memory = model.encode(torch.from_numpy(src), keep_t)
        cross_k, cross_v = model.cross_kv(memory)
        past_k, past_v = model.empty_cache(batch, memory)
        if past_len:
            _, past_k, past_v = model.decode_step(
                torch.from_numpy(prefix), past_k, past_v, cross_k, cross_v, keep_t
            )
    feeds = {C.INPUT_IDS: rng.integers(first, cfg.tgt_vocab_size, (batch, new_len))}
    layers = cfg.n_decoder_layers
    for family, tensors in (
        (C.PAST_K, past_k),
        (C.PAST_V, past_v),
        (C.CROSS_K, cross_k),
        (C.CROSS_V, cross_v),
    ):
        feeds.update(zip(C.layer_names(family, layers), (t.numpy() for t in tensors), strict=True))
    feeds[C.SRC_MASK] = keep
    return feeds


def _decoder_args(feeds: dict[str, np.ndarray], layers: int) -> list[Any]:
    """`Seq2SeqTransformer.decode_step`'s arguments from decoder-graph feeds."""
    args: list[Any] = [torch.from_numpy(feeds[C.INPUT_IDS])]
    for family in (C.PAST_K, C.PAST_V, C.CROSS_K, C.CROSS_V):
        args.append(tuple(torch.from_numpy(feeds[n]) for n in C.layer_names(family, layers)))
    return [*args, torch.from_numpy(feeds[C.SRC_MASK])]


def level1_graphs(model: Seq2SeqTransformer, engine: OrtStep, seed: int = 0) -> dict[str, Any]:
    """Every output of both graphs vs PyTorch over the LEVEL1_* grids: max |Δ| per output
    family (`memory`, `cross_k`, ..., the per-layer tensors of a family pooled), and its
    `bound`: TOLERANCE_FP32, or for a family past it the bound of PyTorch's own float32 error
    on the same cases (`float64_noise`)."""
    cfg, rng = model.cfg, np.random.default_rng(seed)
    first, layers = len(C.SPECIAL_TOKENS), cfg.n_decoder_layers
    worst = dict.fromkeys(C.ENCODER_FAMILIES + C.DECODER_FAMILIES, 0.0)
    worst_case: dict[str, Any] = {}

    def record(names: Sequence[str], want: Sequence[Any], got: Sequence[Any], case: Any) -> None:
        for name, expected, have in zip(names, want, got, strict=True):
            diff, family = max_abs_diff(expected.numpy(), have), C.family(name)
            if diff > worst[family]:
                worst[family] = diff
                worst_case[family] = case

    encoder_inputs: list[np.ndarray] = []
    decoder_inputs: list[list[Any]] = []
    encoder_outputs = C.encoder_outputs(layers)
    for batch, src_len in itertools.product(LEVEL1_BATCHES, LEVEL1_SRC_LENS):
        if src_len > cfg.max_len:
            continue
        keep = _random_mask(rng, batch, src_len)
        src = np.where(keep, rng.integers(first, cfg.src_vocab_size, (batch, src_len)), cfg.pad_id)
        with torch.no_grad():
            src_t = torch.from_numpy(src)
            memory = model.encode(src_t, model.source_keep(src_t))
            cross_k, cross_v = model.cross_kv(memory)
        got = engine.encoder.run(list(encoder_outputs), {C.SRC_IDS: src})
        case = {"batch": batch, "src_len": src_len}
        record(encoder_outputs, (memory, *cross_k, *cross_v), got, case)
        encoder_inputs.append(src)
    decoder_outputs = C.decoder_outputs(layers)
    grid = itertools.product(LEVEL1_BATCHES, LEVEL1_SRC_LENS, LEVEL1_PAST_LENS, LEVEL1_NEW_LENS)
    for batch, src_len, past_len, new_len in grid:
        if src_len > cfg.max_len or past_len + new_len > cfg.max_len:
            continue
        feeds = decoder_feeds(model, rng, batch, src_len, past_len, new_len)
        args = _decoder_args(feeds, layers)
        with torch.no_grad():
            logits, present_k, present_v = model.decode_step(*args)
        got = engine.decoder.run(list(decoder_outputs), feeds)
        case = {"batch": batch, "src_len": src_len, "past_len": past_len, "new_len": new_len}
        record(decoder_outputs, (logits, *present_k, *present_v), got, case)
        decoder_inputs.append(args)
    report: dict[str, Any] = {
        "encoder_cases": len(encoder_inputs),
        "decoder_cases": len(decoder_inputs),
        "max_abs_diff": worst,
        "worst_case": worst_case,
        "tolerance": TOLERANCE_FP32,
    }
    bound = dict.fromkeys(worst, TOLERANCE_FP32)
    if any(diff > TOLERANCE_FP32 for diff in worst.values()):
        noise = _float64_noise(model, encoder_inputs, decoder_inputs)
        bound |= {f: noise_bound(noise[f]) for f in bound if worst[f] > TOLERANCE_FP32}
        report |= {"float64_noise": noise, "noise_factor": NOISE_FACTOR}
    report["bound"] = bound
    report["passed"] = all(worst[family] <= bound[family] for family in worst)
    return report


def _float64_noise(
    model: Seq2SeqTransformer,
    encoder_inputs: Sequence[np.ndarray],
    decoder_inputs: Sequence[Sequence[Any]],
) -> dict[str, float]:
    """PyTorch's float32 error per output family (max over level 1's cases)."""
    twin, noise = float64_twin(model), {}
    for per_case in (
        *(encoder_noise(model, twin, src) for src in encoder_inputs),
        *(decoder_noise(model, twin, args) for args in decoder_inputs),
    ):
        for family, value in per_case.items():
            noise[family] = max(noise.get(family, 0.0), value)
    return noise
