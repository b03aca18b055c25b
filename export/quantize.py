"""int8 graphs: dynamic quantization of the weight MatMul/Gemm nodes, grouped by layer.

    nodes = weight_nodes(onnx.load("b/decoder.onnx"))      # [WeightNode(name, op, group), ...]
    quantize_graph("b/decoder.onnx", "b/decoder.int8.onnx", exclude={"decoder layer 1"})

`onnxruntime.quantization.quantize_dynamic` turns each weight MatMul/Gemm into
`DynamicQuantizeLinear` + `MatMulInteger` with int8 weights (activations are quantized to
uint8 at run time), the output projection (the MatMul/Gemm that computes `logits`) included:
a `Transpose` of its weight is folded first (`fold_weight_transposes`). Left in fp32: the
token embeddings unless `quantize_all` (Gather, never in `op_types_to_quantize` otherwise),
the positional table (an initializer read by Slice, which the quantizer never touches) and
the groups a caller excludes.

Nodes are grouped by the module that produced them, read from the `namespace` metadata the
dynamo exporter writes on every node ("... model.decoder_layers.1.self_attn.w_q ..." ->
"decoder layer 1"; the fused wrappers name their fused projections "decoder_layers.1" too,
export/kinds/seq2seq/wrappers.py); the cross-attention K/V projections of decoder layer N
live in the encoder graph but belong to "decoder layer N", so excluding a group affects both graphs.
Weights without a layer fall into "other".

Dynamo-exported graphs carry `value_info` for weights; the quantizer rewrites a Gemm into a
MatMul with a transposed weight of the same name, so that entry goes stale and the
quantizer crashes with a shape error (shared/PITFALLS.md). `quantize_graph` removes the
weights' `value_info` before quantizing.

A source graph with external data (export/external_data.py) is handed to the quantizer as a
file (a message would be deep-copied, saved and loaded again: NLLB-200-600M's int8 export
peaked at 15.5 GB that way), quantized with its external data format, and the result re-saved
by the threshold's rule.
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

from edgeseq.runtime import constants as C

from .external_data import data_file, has_external_data, load_graph, settle_external_data

WEIGHT_OPS = ("MatMul", "Gemm")
OTHER_GROUP = "other"
OUTPUT_GROUP = "output projection"
LAYER_PATTERN = re.compile(r"(?<![\w])(encoder|decoder)_layers\.(\d+)")
# One scale per output channel: closer to fp32 than one per tensor at the same speed, for a
# few more bytes (docs/export.md, "Variants": int8).
PER_CHANNEL = True
# 7-bit weights (onnxruntime's `reduce_range`). x86 CPUs without VNNI multiply uint8 x int8
# with VPMADDUBSW, which adds pairs of products into int16 and saturates with 8-bit weights,
# so the int8 graph drifts from fp32. A bundle is gated on the machine that exports it but
# runs on others, so the default is the range that cannot saturate on any of them
# (docs/export.md, "Variants": int8; the measurements are in docs/experiments.md).
REDUCE_RANGE = True


@dataclass(frozen=True)
class WeightNode:
    """A MatMul/Gemm node with a constant weight, and the layer group it belongs to."""

    name: str
    op_type: str
    group: str  # "encoder layer 0", "decoder layer 1", "output projection" or "other"


def _initializers(model: onnx.ModelProto) -> set[str]:
    return {init.name for init in model.graph.initializer}


def _namespace(node: onnx.NodeProto) -> str:
    return next((p.value for p in node.metadata_props if p.key == "namespace"), "")


def logits_nodes(model: onnx.ModelProto) -> set[str]:
    """Names of the MatMul/Gemm nodes that compute the graph output `logits`: walking back
    from `logits` through the producers, the first MatMul/Gemm on each path (the output
    projection; empty for a graph without `logits`, e.g. the encoder)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    found: set[str] = set()
    todo = [o.name for o in model.graph.output if o.name == C.LOGITS]
    seen: set[str] = set()
    while todo:
        node = producer.get(todo.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type in WEIGHT_OPS:
            found.add(node.name)
        else:
            todo.extend(node.input)
    return found


def layer_group(node: onnx.NodeProto) -> str:
    """ "encoder layer N" / "decoder layer N" from the node's namespace, else "other"."""
    match = LAYER_PATTERN.search(_namespace(node))
    return f"{match.group(1)} layer {match.group(2)}" if match else OTHER_GROUP


def weight_nodes(model: onnx.ModelProto) -> list[WeightNode]:
    """Every MatMul/Gemm whose second input is an initializer, in graph order."""
    inits, logits = _initializers(model), logits_nodes(model)
    out = []
    for node in model.graph.node:
        if node.op_type in WEIGHT_OPS and len(node.input) > 1 and node.input[1] in inits:
            group = OUTPUT_GROUP if node.name in logits else layer_group(node)
            out.append(WeightNode(node.name, node.op_type, group))
    return out


def strip_weight_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove `value_info` entries of initializers (in place); return the model."""
    inits = _initializers(model)
    keep = [v for v in model.graph.value_info if v.name not in inits]
    del model.graph.value_info[:]
    model.graph.value_info.extend(keep)
    return model


def fold_weight_transposes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace `Transpose(initializer)` feeding the weight input of MatMul/Gemm nodes by the
    transposed initializer (in place); return the model.

    A tied or `nn.Linear` output projection exports as `MatMul(x, Transpose(W))` with W
    (vocab, D): onnxruntime folds the Transpose when it loads the graph, but the quantizer
    only sees a MatMul whose weight is not an initializer and leaves it in fp32. Initializers
    nothing reads any more are removed."""
    from onnx import numpy_helper

    inits = {init.name: init for init in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}
    folded = []
    for node in model.graph.node:
        if node.op_type != "Transpose" or node.input[0] not in inits:
            continue
        out = node.output[0]
        users = readers.get(out, [])
        weight_only = all(u.op_type in WEIGHT_OPS and list(u.input).index(out) == 1 for u in users)
        if not users or not weight_only or out in graph_outputs:
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        weight = numpy_helper.to_array(inits[node.input[0]])
        model.graph.initializer.append(numpy_helper.from_array(weight.transpose(perm), out))
        folded.append(node)
    for node in folded:
        model.graph.node.remove(node)
    used = {name for node in model.graph.node for name in node.input}
    used |= graph_outputs
    unused = [init for init in model.graph.initializer if init.name not in used]
    for init in unused:
        model.graph.initializer.remove(init)
    return model


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the quantizer's root-logger advice ("consider to run pre-processing")."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def quantize_graph(
    source: str | Path,
    target: str | Path,
    exclude: Collection[str] = (),
    *,
    quantize_all: bool = False,
    per_channel: bool = PER_CHANNEL,
    reduce_range: bool = REDUCE_RANGE,
) -> dict[str, list[str]]:
    """Write the int8 version of graph `source` to `target`; return the names of the
    quantized and the fp32-kept weight nodes ({"quantized": [...], "kept": [...]}).

    `exclude` names groups (see `weight_nodes`: layer groups, "other", the output projection)
    kept in fp32; every other weight MatMul/Gemm is quantized, the output projection too
    (after `fold_weight_transposes`). `quantize_all` also quantizes the embedding Gathers.
    `reduce_range` stores weights in 7 bits (see REDUCE_RANGE)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = fold_weight_transposes(strip_weight_value_info(load_graph(source)))
    external = has_external_data(source)
    data_file(target).unlink(missing_ok=True)  # the quantizer appends to an existing one
    nodes = weight_nodes(model)
    kept = [n.name for n in nodes if n.group in set(exclude)]
    op_types = [*WEIGHT_OPS, "Gather"] if quantize_all else list(WEIGHT_OPS)
    with _quiet(), tempfile.TemporaryDirectory(prefix=".quantize-", dir=Path(target).parent) as tmp:
        if external:  # handed over as a file: a message would be deep-copied and reloaded
            staged = Path(tmp) / "folded.onnx"
            onnx.save_model(
                model, str(staged), save_as_external_data=True, location=f"{staged.name}.data"
            )
            del model
        quantize_dynamic(
            str(staged) if external else model,
            str(target),
            op_types_to_quantize=op_types,
            per_channel=per_channel,
            reduce_range=reduce_range,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=kept,
            use_external_data_format=external,
        )
    if external:
        settle_external_data(target)
    quantized = [n.name for n in nodes if n.name not in kept]
    return {"quantized": quantized, "kept": kept}


def graph_groups(*models: onnx.ModelProto) -> list[str]:
    """The groups with weight nodes in `models`, encoder layers first, then decoder layers,
    then "other" and the output projection (after `fold_weight_transposes`)."""
    groups = {n.group for m in models for n in weight_nodes(fold_weight_transposes(m))}

    def order(group: str) -> tuple[int, int, str]:
        match = re.fullmatch(r"(encoder|decoder) layer (\d+)", group)
        if match is None:
            return (2, 0, group)
        return (0 if match.group(1) == "encoder" else 1, int(match.group(2)), group)

    return sorted(groups, key=order)
