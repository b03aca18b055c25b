"""The search's outputs of a decoder-step graph (docs/bundle.md, "The search's outputs"):
the top-k logits of each row's last new position, their ids and the log-softmax's
normaliser, computed in the graph after `logits`, so that greedy and beam search read
(rows x k) numbers per step instead of (rows x vocabulary).

    export_module(..., edit=top_outputs_editor(cfg))   # decoder.onnx, decoder.inplace.onnx
    strip_top_outputs(graph)                          # out again (BeamSearch subgraph)

The runtime ranks by `topk_logits - topk_logits[:, 0] - log_normalizer` in float64: the
order within a row is the logits' own (TopK on the float32 logits, ties by the lower id, as
numpy's stable sorts and argmax), and the only rounding the float32 graph adds is one per
row, in `log_normalizer` (a number in [0, log V]: its float32 sum, at most 6e-6 off float64
at 58,101 rows; float64 above `FLOAT64_SUM_ROWS`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig

PREFIX = C.TOP_NODE_PREFIX  # names of the nodes and constants added here
# Above this many vocabulary rows the normaliser's sum runs in float64. A float32 sum drops
# the terms below half an ulp of the running total, and more such terms lose more: 256,206
# rows (NLLB-200) put a float32 sum 2e-5 to 3.5e-5 off float64 per row, enough to move beam
# scores 2e-4 off the float64 logits path; 58,101 (opus-mt) 6e-6. The float64 path takes
# several passes over the logits where float32's LogSoftmax is one kernel, about half the
# time (benchmarks/normaliser_sum.py), so smaller vocabularies keep float32.
FLOAT64_SUM_ROWS = 65536


def top_outputs_editor(cfg: ModelConfig) -> Callable[[onnx.ModelProto], None]:
    """`add_top_outputs` for `cfg`, as `export_module`'s `edit`."""
    return lambda proto: add_top_outputs(proto, cfg)


def add_top_outputs(proto: onnx.ModelProto, cfg: ModelConfig) -> None:
    """Append `topk_ids` int64 [batch, k], `topk_logits` float32 [batch, k] (k =
    `C.topk_width(V)`, largest first) and `log_normalizer` float32 [batch] (log of the sum of
    exp(logit - max logit)) of `logits[:, -1]` to a decoder-step graph whose output `logits`
    is float32 [batch, new_len, V].

    The vocabulary-wide work reads `logits` as it is, over its last axis, and only its small
    results are gathered at the last position: a step has one new position, and gathering
    (batch, V) logits first would copy them."""
    _require_opset(proto, 18)  # ReduceMax's axes as an input
    graph, k = proto.graph, C.topk_width(cfg.tgt_vocab_size)
    logits = next(o for o in graph.output if o.name == C.LOGITS)
    batch = logits.type.tensor_type.shape.dim[0].dim_param or C.BATCH

    def n(name: str) -> str:
        return PREFIX + name

    graph.initializer.extend(
        numpy_helper.from_array(array, n(name))
        for name, array in (
            ("last", _int64(-1, scalar=True)),
            ("k", _int64(k)),
            ("axis", _int64(-1)),
        )
    )
    float64 = cfg.tgt_vocab_size > FLOAT64_SUM_ROWS
    graph.node.extend(
        [
            helper.make_node(
                "TopK",
                [C.LOGITS, n("k")],
                [n("values"), n("ids")],
                n("TopK"),
                axis=-1,
                largest=1,
                sorted=1,
            ),
            *normaliser_nodes(C.LOGITS, n("axis"), n("log"), float64, PREFIX),
            *(
                helper.make_node("Gather", [n(name), n("last")], [out], n(f"Gather_{name}"), axis=1)
                for name, out in (
                    ("values", C.TOPK_LOGITS),
                    ("ids", C.TOPK_IDS),
                    ("log", C.LOG_NORMALIZER),
                )
            ),
        ]
    )
    graph.output.extend(
        [
            helper.make_tensor_value_info(C.TOPK_IDS, TensorProto.INT64, [batch, k]),
            helper.make_tensor_value_info(C.TOPK_LOGITS, TensorProto.FLOAT, [batch, k]),
            helper.make_tensor_value_info(C.LOG_NORMALIZER, TensorProto.FLOAT, [batch]),
        ]
    )


def normaliser_nodes(
    logits: str, axis: str, out: str, float64: bool, prefix: str = ""
) -> list[onnx.NodeProto]:
    """Nodes computing `out` = log(sum(exp(x - max x))) over the last axis of float32
    `logits` (that axis dropped), where `axis` names the int64 constant [-1]. The max is not
    added back: a float32 result with it would round at its magnitude.

    float32: -max(LogSoftmax(x)), one vectorised kernel (at the max, LogSoftmax is
    (x - max) - log(sum) = -log(sum)). float64: the shifted exponentials summed in float64."""

    def n(name: str) -> str:
        return f"{prefix}{name}"

    if not float64:
        return [
            helper.make_node("LogSoftmax", [logits], [n("log_softmax")], n("LogSoftmax"), axis=-1),
            helper.make_node(
                "ReduceMax", [n("log_softmax"), axis], [n("neg_log")], n("ReduceMax"), keepdims=0
            ),
            helper.make_node("Neg", [n("neg_log")], [out], n("Neg")),
        ]
    return [
        helper.make_node("ReduceMax", [logits, axis], [n("max")], n("ReduceMax")),
        helper.make_node("Sub", [logits, n("max")], [n("shifted")], n("Sub")),
        helper.make_node("Exp", [n("shifted")], [n("exp")], n("Exp")),
        helper.make_node("Cast", [n("exp")], [n("exp64")], n("Cast64"), to=TensorProto.DOUBLE),
        helper.make_node("ReduceSum", [n("exp64"), axis], [n("sum")], n("ReduceSum"), keepdims=0),
        helper.make_node("Log", [n("sum")], [n("log64")], n("Log")),
        helper.make_node("Cast", [n("log64")], [out], n("Cast32"), to=TensorProto.FLOAT),
    ]


def strip_top_outputs(graph: onnx.GraphProto) -> None:
    """Remove what `add_top_outputs` added (nodes, constants, outputs) from `graph`."""
    nodes = [node for node in graph.node if not node.name.startswith(PREFIX)]
    inits = [t for t in graph.initializer if not t.name.startswith(PREFIX)]
    outputs = [o for o in graph.output if o.name not in C.TOP_OUTPUTS]
    for field, kept in ((graph.node, nodes), (graph.initializer, inits), (graph.output, outputs)):
        del field[:]
        field.extend(kept)


def _int64(value: int, scalar: bool = False) -> np.ndarray:
    """int64 `value` as a scalar or as a (1,) array."""
    return np.array(value if scalar else [value], dtype=np.int64)


def _require_opset(proto: onnx.ModelProto, least: int) -> None:
    """The default domain's opset is at least `least` (the exporter's minimum is 18)."""
    version = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if version < least:
        raise ValueError(f"the search's outputs need opset {least}+, the graph has {version}")
