"""Export the encoder and decoder-step graphs with `torch.onnx.export(dynamo=True)`.

    encoder_info = export_encoder(model, "b/encoder.onnx")     # GraphInfo: sizes, time, io
    decoder_info = export_decoder(model, "b/decoder.onnx", opset=20)

Every axis named in `runtime/constants.py` (batch, src_len, past_len, new_len) is dynamic
(`graph_dims`). The dynamo exporter specialises an axis whose example size is 0 or 1, so
the example inputs use sizes >= 2 everywhere (`example_sizes`; past_len = 0 is tested
afterwards, not traced). The export itself, its checks and metadata are
export/onnx_export.py's `export_module`, shared by every kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.export import Dim

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig

from ...onnx_export import GraphInfo, export_module
from ...top_outputs import top_outputs_editor
from .wrappers import FusedDecoderStep, FusedEncoder, OnnxDecoderStep, OnnxEncoder

EXAMPLE_SIZE = {C.BATCH: 2, C.SRC_LEN: 5, C.PAST_LEN: 3, C.NEW_LEN: 2}  # all >= 2: see above


def example_sizes(cfg: ModelConfig) -> dict[str, int]:
    """EXAMPLE_SIZE fitted to the positional table: src_len <= max_len and past_len + new_len
    <= max_len, every size >= 2 (ModelConfig requires max_len >= 4 for this)."""
    sizes = dict(EXAMPLE_SIZE)
    sizes[C.SRC_LEN] = min(sizes[C.SRC_LEN], cfg.max_len)
    sizes[C.PAST_LEN] = min(sizes[C.PAST_LEN], cfg.max_len - sizes[C.NEW_LEN])
    return sizes


def graph_dims(cfg: ModelConfig) -> dict[str, Dim]:
    """The dynamic axes, bounded by the positional table where positions are involved."""
    return {
        C.BATCH: Dim(C.BATCH, min=1),
        C.SRC_LEN: Dim(C.SRC_LEN, min=1, max=cfg.max_positions),
        C.PAST_LEN: Dim(C.PAST_LEN, min=0, max=cfg.max_positions),
        C.NEW_LEN: Dim(C.NEW_LEN, min=1, max=cfg.max_positions),
    }


def export_encoder(
    model: Seq2SeqTransformer,
    path: str | Path,
    opset: int | None = None,
    fuse: bool = True,
    metadata: dict[str, str] | None = None,
) -> GraphInfo:
    """Write the encoder graph to `path`: `FusedEncoder` (fused attention and projections)
    or, with `fuse=False`, `OnnxEncoder` (standard ONNX operators only). `metadata` adds
    metadata_props entries (the vocabulary fingerprints)."""
    cfg, dims, sizes = model.cfg, graph_dims(model.cfg), example_sizes(model.cfg)
    batch, src_len = sizes[C.BATCH], sizes[C.SRC_LEN]
    src_ids = torch.randint(len(C.SPECIAL_TOKENS), cfg.src_vocab_size, (batch, src_len))
    dynamic = {C.SRC_IDS: {0: dims[C.BATCH], 1: dims[C.SRC_LEN]}}
    names = (C.ENCODER_INPUTS, C.encoder_outputs(cfg.n_decoder_layers))
    module = FusedEncoder(model) if fuse else OnnxEncoder(model)
    return export_module(module, (src_ids,), dynamic, names, cfg, "encoder", path, opset, metadata)


def decoder_example(cfg: ModelConfig) -> tuple[Any, ...]:
    """Example inputs of the decoder step (`OnnxDecoderStep.forward`'s arguments: K/V as
    L-tuples), every dynamic axis of size >= 2."""
    sizes = example_sizes(cfg)
    batch, src_len = sizes[C.BATCH], sizes[C.SRC_LEN]
    past_len, new_len = sizes[C.PAST_LEN], sizes[C.NEW_LEN]
    layers, heads, d_head = cfg.n_decoder_layers, cfg.n_heads, cfg.d_head

    def per_layer(length: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(batch, heads, length, d_head) for _ in range(layers))

    return (
        torch.randint(len(C.SPECIAL_TOKENS), cfg.tgt_vocab_size, (batch, new_len)),
        per_layer(past_len),
        per_layer(past_len),
        per_layer(src_len),
        per_layer(src_len),
        torch.ones(batch, src_len, dtype=torch.bool),
    )


def export_decoder(
    model: Seq2SeqTransformer,
    path: str | Path,
    opset: int | None = None,
    fuse: bool = True,
    metadata: dict[str, str] | None = None,
) -> GraphInfo:
    """Write the decoder-step graph to `path`: `FusedDecoderStep` or, with `fuse=False`,
    `OnnxDecoderStep` (standard ONNX operators only); `metadata` as for `export_encoder`."""
    cfg, dims = model.cfg, graph_dims(model.cfg)
    batch, src_len, past_len = dims[C.BATCH], dims[C.SRC_LEN], dims[C.PAST_LEN]
    layers = cfg.n_decoder_layers
    cache = ({0: batch, 2: past_len},) * layers
    cross = ({0: batch, 2: src_len},) * layers
    dynamic = {  # keyed by OnnxDecoderStep.forward's parameter names
        "input_ids": {0: batch, 1: dims[C.NEW_LEN]},
        "past_k": cache,
        "past_v": cache,
        "cross_k": cross,
        "cross_v": cross,
        "src_mask": {0: batch, 1: src_len},
    }
    args = decoder_example(cfg)
    names = (C.decoder_inputs(layers), C.decoder_outputs(layers))
    module = FusedDecoderStep(model) if fuse else OnnxDecoderStep(model)
    edit = top_outputs_editor(cfg)  # + topk_ids, topk_logits, log_normalizer
    return export_module(module, args, dynamic, names, cfg, "decoder", path, opset, metadata, edit)
