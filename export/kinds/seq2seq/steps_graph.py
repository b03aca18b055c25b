"""The step-batching variant: a decoder-step graph whose rows can be at different positions.

    info = export_steps_decoder(model, "b/decoder.steps.onnx", fuse=True)
    manifest["steps"] = write_steps_graphs(directory, model, table)   # docs/bundle.md
    # its parity group: steps_parity.py, run by the registry (graph_variants.py)

`decoder.onnx` derives every row's position from the cache length, so all rows of a batch
must be at the same step. This graph (`decoder.steps.onnx`, and `decoder.steps.int8.onnx`
when int8 is exported, quantized as `decoder.int8.onnx` was, `decoder.steps.fp16.onnx` when
fp16 is, converted as `decoder.fp16.onnx` was) takes the same inputs plus
`position_ids` int64 [batch, new_len] (rows of the positional table) and `tgt_mask` bool
[batch, past_len + new_len] (True at cache slots a row may attend to), so a server can add
rows to a running batch at any step and drop them when done (runtime/serve/continuous.py).
The outputs are decoder.onnx's. `bundle.md`'s decoder contract is unchanged: this graph is an
extra file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig

from ...external_data import graph_bytes, load_graph, save_graph
from ...fused_ops import masked_self_attention
from ...fused_relative_ops import biased_masked_self_attention
from ...onnx_export import GraphInfo, export_module
from .graphs import decoder_example, example_sizes, graph_dims
from .precisions import add_precisions
from .wrappers import FusedDecoderStep, slot_bias

Progress = Callable[[str], None]


class OnnxStepsDecoder(nn.Module):
    """Decoder-step graph with per-row positions (standard ONNX operators only).

    Inputs: those of `OnnxDecoderStep` (input_ids [B, N], past_k.i/past_v.i [B, H, P, dh],
    cross_k.i/cross_v.i [B, H, S, dh], src_mask [B, S]), then
        position_ids  int64 [B, N]    positional table rows of the new tokens
        tgt_mask      bool  [B, P+N]  True at the cache slots (and new tokens) a row may see
    Outputs: logits [B, N, V], present_k.i/present_v.i [B, H, P+N, dh], as `OnnxDecoderStep`.

    New token i (slot P+i) sees slot j when j <= P+i and tgt_mask[:, j]; a masked slot's keys
    and values are multiplied by zero weights, so they must be finite (zeros are).
    """

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        past_k: tuple[Tensor, ...],
        past_v: tuple[Tensor, ...],
        cross_k: tuple[Tensor, ...],
        cross_v: tuple[Tensor, ...],
        src_mask: Tensor,
        position_ids: Tensor,
        tgt_mask: Tensor,
    ) -> tuple[Tensor, ...]:
        """One step -> logits (B, N, V), L present_k then L present_v (B, H, P+N, dh)."""
        logits, present_k, present_v = self.model.decode_step(
            input_ids, past_k, past_v, cross_k, cross_v, src_mask, tgt_mask, position_ids
        )
        return (logits, *present_k, *present_v)


class FusedStepsDecoder(FusedDecoderStep):
    """`OnnxStepsDecoder`'s graph with `FusedDecoderStep`'s fused operators (and module
    names, which int8 groups weights by: export/quantize.py): one Q/K/V projection and one
    `MultiHeadAttention` node per self-attention, whose key padding mask is tgt_mask
    (onnxruntime's CPU kernel takes a mask of past + new length with a cache). With
    positional "relative" the score bias is of cache slots (`slot_bias`): a row's columns are
    contiguous, so slot distances are its position distances."""

    def forward(  # type: ignore[override]
        self,
        input_ids: Tensor,
        past_k: tuple[Tensor, ...],
        past_v: tuple[Tensor, ...],
        cross_k: tuple[Tensor, ...],
        cross_v: tuple[Tensor, ...],
        src_mask: Tensor,
        position_ids: Tensor,
        tgt_mask: Tensor,
    ) -> tuple[Tensor, ...]:
        """One step -> logits (B, N, V), L present_k then L present_v (B, H, P+N, dh)."""
        model, n_heads = self.model, self.model.cfg.n_heads
        tgt_keep = tgt_mask.to(torch.int32)  # (B, P+N)
        x = model.embed_target(input_ids, position_ids=position_ids)
        bias = slot_bias(model, past_k[0].shape[2], input_ids.shape[1])  # relative: of slots

        def attend(i: int, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            if bias is None:
                return masked_self_attention(q, k, v, past_k[i], past_v[i], tgt_keep, n_heads)
            return biased_masked_self_attention(
                q, k, v, past_k[i], past_v[i], tgt_keep, bias, n_heads
            )

        return self.layers(x, attend, cross_k, cross_v, src_mask)


def steps_example(cfg: ModelConfig) -> tuple[Any, ...]:
    """decoder_example's inputs plus position_ids (rows at different positions) and a
    tgt_mask with masked slots, every dynamic axis of size >= 2."""
    sizes = example_sizes(cfg)
    batch, past, new = sizes[C.BATCH], sizes[C.PAST_LEN], sizes[C.NEW_LEN]
    offsets = torch.arange(batch)[:, None] % (cfg.max_len - past - new + 1)  # (B, 1)
    positions = torch.arange(new)[None, :] + past - offsets  # (B, N), >= 0
    tgt_mask = torch.ones(batch, past + new, dtype=torch.bool)
    tgt_mask[1:, :1] = False
    return (*decoder_example(cfg), positions.clamp(min=0), tgt_mask)


def export_steps_decoder(
    model: Seq2SeqTransformer,
    path: str | Path,
    opset: int | None = None,
    fuse: bool = True,
    metadata: dict[str, str] | None = None,
) -> GraphInfo:
    """Write the step-batching decoder graph to `path`: `FusedStepsDecoder` or, with
    `fuse=False`, `OnnxStepsDecoder`; `metadata` as for `export_decoder`."""
    cfg, dims = model.cfg, graph_dims(model.cfg)
    batch, src_len, past_len = dims[C.BATCH], dims[C.SRC_LEN], dims[C.PAST_LEN]
    layers = cfg.n_decoder_layers
    cache = ({0: batch, 2: past_len},) * layers
    cross = ({0: batch, 2: src_len},) * layers
    dynamic = {  # keyed by the wrappers' forward parameter names
        "input_ids": {0: batch, 1: dims[C.NEW_LEN]},
        "past_k": cache,
        "past_v": cache,
        "cross_k": cross,
        "cross_v": cross,
        "src_mask": {0: batch, 1: src_len},
        "position_ids": {0: batch, 1: dims[C.NEW_LEN]},
        "tgt_mask": {0: batch, 1: Dim.AUTO},  # past_len + new_len: a sum, not a Dim
    }
    names = (C.steps_decoder_inputs(layers), C.decoder_outputs(layers))
    module = FusedStepsDecoder(model) if fuse else OnnxStepsDecoder(model)
    args = steps_example(cfg)
    info = export_module(module, args, dynamic, names, cfg, "decoder", path, opset, metadata)
    _name_total_axis(Path(path), info)
    return info


def _name_total_axis(path: Path, info: GraphInfo) -> None:
    """Name the past + new axis (tgt_mask's, the presents') as decoder.onnx names it: the
    exporter writes the mask's as a fresh symbol."""
    proto = load_graph(path)
    known = {C.BATCH, C.SRC_LEN, C.PAST_LEN, C.NEW_LEN, C.STEPS_TOTAL_LEN}
    for value in (*proto.graph.input, *proto.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param and dim.dim_param not in known:
                dim.dim_param = C.STEPS_TOTAL_LEN
    save_graph(proto, path)
    for spec in (*info.inputs, *info.outputs):
        spec["shape"] = [d if not isinstance(d, str) or d in known else C.STEPS_TOTAL_LEN
                         for d in spec["shape"]]  # fmt: skip
    info.bytes = graph_bytes(path)


def write_steps_graphs(
    directory: Path,
    model: Seq2SeqTransformer,
    table: dict[str, dict[str, Any]],
    *,
    opset: int | None = None,
    fuse: bool = True,
    metadata: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the steps graph of fp32 (and int8 when `table` has it) into `directory`; return
    its manifest entry."""
    say = progress or (lambda _: None)
    fp32 = directory / C.STEPS_FILES["fp32"]
    info = export_steps_decoder(model, fp32, opset, fuse, metadata)
    say(f"  {fp32.name}: {info.bytes / 1e6:.2f} MB in {info.seconds:.1f} s")
    extra = [spec for spec in info.inputs if spec["name"] in (C.POSITION_IDS, C.TGT_MASK)]
    entry: dict[str, Any] = {"fused": fuse, "inputs": extra}
    add_precisions(entry, directory, C.STEPS_FILES, table, say)
    return entry
