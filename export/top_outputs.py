"""The search's outputs of a decoder-step graph (docs/bundle.md, "The search's outputs"):
the top-k logits of each row's last new position, their ids and the log-softmax's
normaliser, computed in the graph after `logits`, so that greedy and beam search read
(rows x k) numbers per step instead of (rows x vocabulary).

    export_module(..., edit=top_outputs_editor(cfg))   # decoder.onnx, decoder.inplace.onnx
    strip_top_outputs(graph)                          # out again (BeamSearch subgraph)

The runtime ranks by `topk_logits - topk_logits[:, 0] - log_normalizer` in float64: the
order within a row is the logits' own (TopK on the float32 logits, ties by the lower id, as
numpy's stable sorts and argmax), and the only rounding the float32 graph adds is one per
row, in `log_normalizer` (a number in [0, log V], where float32 steps are <= 5e-7).
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
# rows (NLLB-200) put the log 3.5e-5 off per step and beam scores 2e-4 off the float64 logits
# path; 58,101 (opus-mt) 1.2e-5. The float64 cast and sum double the normaliser's time (128
# rows of 58,101: 6.5 -> 12.1 ms on one thread; benchmarks/normaliser_sum.py), so smaller
# vocabularies keep float32.
FLOAT64_SUM_ROWS = 65536


def top_outputs_editor(cfg: ModelConfig) -> Callable[[onnx.ModelProto], None]:
    """`add_top_outputs` for `cfg`, as `export_module`'s `edit`."""
    return lambda proto: add_top_outputs(proto, cfg)


def add_top_outputs(proto: onnx.ModelProto, cfg: ModelConfig) -> None:
    """Append `topk_ids` int64 [batch, k], `topk_logits` float32 [batch, k] (k =
    `C.topk_width(V)`, largest first) and `log_normalizer` float32 [batch] (log of the sum of
    exp(logit - max logit)) of `logits[:, -1]` to a decoder-step graph whose output `logits`
    is float32 [batch, new_len, V]."""
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
            ("rows", _int64(1)),
        )
    )
    graph.node.extend(
        [
            helper.make_node("Gather", [C.LOGITS, n("last")], [n("logits")], n("Gather"), axis=1),
            helper.make_node(
                "TopK",
                [n("logits"), n("k")],
                [C.TOPK_LOGITS, C.TOPK_IDS],
                n("TopK"),
                axis=-1,
                largest=1,
                sorted=1,
            ),
            # log(sum(exp(x - max))), each op over (batch, V) vectorised in onnxruntime; the max
            # is not added back: a float32 sum with it would round at its magnitude
            helper.make_node("ReduceMax", [n("logits"), n("axis")], [n("max")], n("ReduceMax")),
            helper.make_node("Sub", [n("logits"), n("max")], [n("shifted")], n("Sub")),
            helper.make_node("Exp", [n("shifted")], [n("exp")], n("Exp")),
            *log_sum_nodes(n("exp"), n("axis"), n("log"), cfg.tgt_vocab_size > FLOAT64_SUM_ROWS),
            helper.make_node("Squeeze", [n("log"), n("rows")], [C.LOG_NORMALIZER], n("Squeeze")),
        ]
    )
    graph.output.extend(
        [
            helper.make_tensor_value_info(C.TOPK_IDS, TensorProto.INT64, [batch, k]),
            helper.make_tensor_value_info(C.TOPK_LOGITS, TensorProto.FLOAT, [batch, k]),
            helper.make_tensor_value_info(C.LOG_NORMALIZER, TensorProto.FLOAT, [batch]),
        ]
    )


def log_sum_nodes(exp: str, axis: str, out: str, float64: bool) -> list[onnx.NodeProto]:
    """Nodes computing `out` = log(ReduceSum(`exp`, `axis`)), the sum in float64 if asked."""
    if not float64:
        return [
            helper.make_node("ReduceSum", [exp, axis], [exp + "_sum"], exp + "_ReduceSum"),
            helper.make_node("Log", [exp + "_sum"], [out], exp + "_Log"),
        ]
    return [
        helper.make_node("Cast", [exp], [exp + "64"], exp + "_Cast64", to=TensorProto.DOUBLE),
        helper.make_node("ReduceSum", [exp + "64", axis], [exp + "_sum"], exp + "_ReduceSum"),
        helper.make_node("Log", [exp + "_sum"], [exp + "_log"], exp + "_Log"),
        helper.make_node("Cast", [exp + "_log"], [out], exp + "_Cast32", to=TensorProto.FLOAT),
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
