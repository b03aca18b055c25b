"""The in-place cache variant: a decoder-step graph whose self-attention cache is a buffer
that the graph writes into, for the two-graph loop on the CPU.

    info = export_in_place_decoder(model, "b/decoder.inplace.onnx")
    manifest["inplace"] = write_in_place_graphs(directory, model, table)   # docs/bundle.md
    # its parity group: in_place_parity.py, run by the registry (graph_variants.py)

`decoder.onnx` returns a new `present_k.i` (the past plus the new key) every step, and beam
search gathers every hypothesis' cache between steps. This graph (`decoder.inplace.onnx`,
and `decoder.inplace.int8.onnx` when int8 is exported, quantized as `decoder.int8.onnx`
was, `decoder.inplace.fp16.onnx` when fp16 is, converted as `decoder.fp16.onnx` was) takes
one new token per row and a (batch, n_heads, cache_len, d_head) buffer per layer and family,
bound with IO binding as both `past_k.i` and `present_k.i`: its
`DecoderMaskedMultiHeadAttention` nodes write the new key and value at `past_length`, and
read position t of row n * W + w from row n * W + cache_indirection[n, w, t] when
`beam_width` W > 1, so reordering hypotheses is an update of that small int32 table
(runtime/kinds/in_place.py). The cross K/V and src_mask hold one row per block (an input's
hypotheses share its source): each input's W queries attend to its keys together, one
W x S attention per input and head instead of W separate ones. The other inputs and the
logits are decoder.onnx's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.export import Dim

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig

from ...fused_ops import in_place_self_attention
from ...fused_relative_ops import biased_in_place_self_attention
from ...onnx_export import GraphInfo, export_module
from ...top_outputs import top_outputs_editor
from .graphs import decoder_example, example_sizes, graph_dims
from .precisions import add_precisions
from .wrappers import FusedDecoderStep

EXAMPLE_BEAM = 2  # rows per input in the traced example (every dynamic size >= 2)

Progress = Callable[[str], None]


class FusedInPlaceDecoder(FusedDecoderStep):
    """`FusedDecoderStep`'s graph (module names included, which int8 groups weights by) with
    each self-attention one `in_place_self_attention` over the layer's buffers (with
    positional "relative" `biased_in_place_self_attention`, fed the step's one score bias).

    Inputs: input_ids int64 [B, 1]; past_k.i/past_v.i float32 [B, H, M, dh] (the buffers,
    past_length positions filled); cross_k.i/cross_v.i [I, H, S, dh] and src_mask bool [I, S]
    with one row per block of W rows (I = B / W inputs: an input's hypotheses share them);
    cache_mask int32 [B, P+1]; past_length int32 [1] (P, the new token's position);
    beam_width int32 [1] (W); cache_indirection int32 [B/W, W, M].
    Outputs: logits [B, 1, V]; present_k.i/present_v.i [B, H, M, dh], the buffers with
    position P written (the same memory as the inputs when bound so); the search's outputs
    topk_ids, topk_logits, log_normalizer are added to the graph (export/top_outputs.py).
    `per_input` False: cross K/V [B, H, S, dh] and src_mask [B, S], one row per row (the
    layout of graphs exported before, which the runtime still runs).
    """

    def __init__(self, model: Seq2SeqTransformer, per_input: bool = True) -> None:
        super().__init__(model)
        self.per_input = per_input

    def forward(  # type: ignore[override]
        self,
        input_ids: Tensor,
        past_k: tuple[Tensor, ...],
        past_v: tuple[Tensor, ...],
        cross_k: tuple[Tensor, ...],
        cross_v: tuple[Tensor, ...],
        src_mask: Tensor,
        cache_mask: Tensor,
        past_length: Tensor,
        beam_width: Tensor,
        cache_indirection: Tensor,
    ) -> tuple[Tensor, ...]:
        """One step -> logits (B, 1, V), L present_k then L present_v (B, H, M, dh)."""
        model, n_heads = self.model, self.model.cfg.n_heads
        positions = past_length.to(torch.int64).reshape(1, 1).expand(input_ids.shape)
        x = model.embed_target(input_ids, position_ids=positions)
        bias = None  # positional "relative": (1, H, 1, P+1), position P over 0..P
        if model.decoder_relative is not None:
            q_pos = past_length.to(torch.int64).reshape(1)
            bias = model.decoder_relative(q_pos, torch.arange(cache_mask.shape[1]))

        def attend(i: int, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            if bias is None:
                return in_place_self_attention(
                    q, k, v, cache_mask, past_k[i], past_v[i], past_length, beam_width,
                    cache_indirection, n_heads,
                )  # fmt: skip
            return biased_in_place_self_attention(
                q, k, v, cache_mask, bias, past_k[i], past_v[i], past_length, beam_width,
                cache_indirection, n_heads,
            )  # fmt: skip

        return self.layers(x, attend, cross_k, cross_v, src_mask, per_input=self.per_input)


def in_place_example(cfg: ModelConfig, per_input: bool = True) -> tuple[Any, ...]:
    """Example inputs: decoder_example's cross K/V and mask for 2 inputs x EXAMPLE_BEAM rows
    (one row per input, or with `per_input` False repeated for each row), one new token,
    buffers longer than the filled positions, a shuffled indirection."""
    sizes = example_sizes(cfg)
    inputs, past = sizes[C.BATCH], sizes[C.PAST_LEN]
    batch, length = inputs * EXAMPLE_BEAM, min(past + 3, cfg.max_len)
    _, _, _, cross_k, cross_v, src_mask = decoder_example(cfg)

    if not per_input:
        cross_k, cross_v, src_mask = (
            tuple(t.repeat_interleave(EXAMPLE_BEAM, dim=0) for t in cross_k),
            tuple(t.repeat_interleave(EXAMPLE_BEAM, dim=0) for t in cross_v),
            src_mask.repeat_interleave(EXAMPLE_BEAM, dim=0),
        )

    def buffers() -> tuple[Tensor, ...]:
        shape = (batch, cfg.n_heads, length, cfg.d_head)
        return tuple(torch.randn(shape) for _ in range(cfg.n_decoder_layers))

    return (
        torch.randint(len(C.SPECIAL_TOKENS), cfg.tgt_vocab_size, (batch, 1)),
        buffers(),
        buffers(),
        cross_k,
        cross_v,
        src_mask,
        torch.ones(batch, past + 1, dtype=torch.int32),
        torch.tensor([past], dtype=torch.int32),
        torch.tensor([EXAMPLE_BEAM], dtype=torch.int32),
        torch.randint(0, EXAMPLE_BEAM, (inputs, EXAMPLE_BEAM, length), dtype=torch.int32),
    )


def export_in_place_decoder(
    model: Seq2SeqTransformer,
    path: str | Path,
    opset: int | None = None,
    metadata: dict[str, str] | None = None,
    per_input: bool = True,
) -> GraphInfo:
    """Write the in-place cache decoder graph (`FusedInPlaceDecoder`) to `path`; `metadata`
    as for `export_decoder`. Fused only: the node is onnxruntime's. `per_input` False
    writes the cross K/V layout of graphs exported before (one row per row)."""
    cfg, dims = model.cfg, graph_dims(model.cfg)
    batch, src_len = dims[C.BATCH], dims[C.SRC_LEN]
    cache_len = Dim(C.CACHE_LEN, min=1, max=cfg.max_positions)
    layers = cfg.n_decoder_layers
    cache = ({0: batch, 2: cache_len},) * layers
    inputs = Dim(C.INPUTS, min=1)
    rows = inputs if per_input else batch  # the cross K/V's and src_mask's first axis
    cross = ({0: rows, 2: src_len},) * layers
    dynamic = {  # keyed by FusedInPlaceDecoder.forward's parameter names
        "input_ids": {0: batch},
        "past_k": cache,
        "past_v": cache,
        "cross_k": cross,
        "cross_v": cross,
        "src_mask": {0: rows, 1: src_len},
        "cache_mask": {0: batch, 1: Dim(C.ATTENDED_LEN, min=1, max=cfg.max_positions)},
        "past_length": None,
        "beam_width": None,
        "cache_indirection": {0: inputs, 1: Dim(C.BEAMS, min=1), 2: cache_len},
    }
    names = (C.in_place_decoder_inputs(layers), C.decoder_outputs(layers))
    module = FusedInPlaceDecoder(model, per_input)
    args = in_place_example(cfg, per_input)
    edit = top_outputs_editor(cfg)  # + topk_ids, topk_logits, log_normalizer
    return export_module(module, args, dynamic, names, cfg, "decoder", path, opset, metadata, edit)


def write_in_place_graphs(
    directory: Path,
    model: Seq2SeqTransformer,
    table: dict[str, dict[str, Any]],
    *,
    opset: int | None = None,
    metadata: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the in-place decoder of fp32 (and int8 when `table` has it) into `directory`;
    return its manifest entry."""
    say = progress or (lambda _: None)
    fp32 = directory / C.IN_PLACE_FILES["fp32"]
    info = export_in_place_decoder(model, fp32, opset, metadata)
    say(f"  {fp32.name}: {info.bytes / 1e6:.2f} MB in {info.seconds:.1f} s")
    names = (C.CACHE_MASK, C.PAST_LENGTH, C.BEAM_WIDTH, C.CACHE_INDIRECTION)
    entry: dict[str, Any] = {"inputs": [spec for spec in info.inputs if spec["name"] in names]}
    add_precisions(entry, directory, C.IN_PLACE_FILES, table, say)
    return entry
