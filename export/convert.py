"""fp16 graphs and ORT-format graphs, converted from a bundle's fp32 graphs.

    kept = convert_fp16("b/decoder.onnx", "b/decoder.fp16.onnx")     # names kept in fp32
    convert_ort(["b/encoder.onnx", "b/decoder.onnx"], "b")           # *.ort + config

**fp16** uses the converter shipped with onnxruntime (`onnxruntime.transformers.float16`,
the same code as onnxconverter-common's, so no extra dependency): weights, activations and
the cache become float16, while

- the graph inputs and outputs other than the cache keep their types (`fp32_io_names`):
  the cache (the encoder's `cross_k.i`/`cross_v.i`, the decoder's `past_*`, `present_*` and
  `cross_*`, GPT's `past_key_values.*`/`present.*`) is float16, so that on a GPU the cache
  stays float16 from step to step with no Cast at the graph boundary; `logits`, `memory`,
  BERT's `last_hidden_state` and the search's outputs stay float32, with one Cast each;
- the output projection computing `logits` and the nodes computing the search's outputs from
  them (`topk_ids`, `topk_logits`, `log_normalizer`: export/top_outputs.py) stay float32,
  with Casts around them; where one float32 node reads another's output it reads it
  unrounded (`skip_cast_round_trips`), so the logits and the top-k are float32 values;
- `Softmax` and `LayerNormalization` are float16 by default (onnxruntime's CUDA kernels
  accumulate in float32); `fp32_ops=FP16_KEPT_OPS` keeps them in float32 with Casts around
  them, the fallback when a float16 graph misses its accuracy gate (the precision modules
  convert again and gate that; the manifest's fp16 entry records `fp32_ops`).

The converter inserts one Cast per float32 node reading a float16 tensor, named after the
tensor: a tensor that several such nodes read (an initializer the exporter shares between
layers, such as the LayerNorm weights of a model whose norms all hold ones) gets identical
Casts with one name and one output, which onnxruntime refuses ("two nodes with same node
name"). `merge_duplicate_casts` keeps the first of each; every reader then reads its output.
`check_loads` opens each written graph on onnxruntime's CPU provider and raises
`GraphLoadError` when one does not load, so that export never writes a graph it cannot open.

**ORT format** goes through onnxruntime's own converter
(`onnxruntime.tools.convert_onnx_models_to_ort`, the "Fixed" optimization style at level
"all", layout transformations that are specific to one CPU left out), which also writes
`required_operators.config`: the operator list for a reduced-size onnxruntime build
(`build.sh --include_ops_by_config required_operators.config --minimal_build`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx

from edgeseq.runtime import constants as C
from edgeseq.runtime.errors import EdgeseqError
from edgeseq.runtime.providers import gpu_present

from .external_data import data_file, has_external_data, load_graph, save_graph
from .quantize import logits_nodes

FP16_KEPT_OPS = ("Softmax", "LayerNormalization")  # the fallback's float32 ops
# The float32 operator types of each fp16 conversion a gate tries, in order.
FP16_ATTEMPTS: tuple[tuple[str, ...], ...] = ((), FP16_KEPT_OPS)
SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)  # If, Loop, Scan bodies
REQUIRED_OPERATORS_FILE = "required_operators.config"
FP16_CPU_NOTE = (
    "gate measured on onnxruntime's CPU provider, which runs the fp16 nodes it has no fp16 "
    "kernel for in fp32 (inserted Casts)"
)


def convert_fp16(source: str | Path, target: str | Path, fp32_ops: Sequence[str] = ()) -> list[str]:
    """Write the float16 version of graph `source` to `target`: float16 cache inputs and
    outputs, the others as they were (`fp32_io_names`); operator types `fp32_ops` (e.g.
    `FP16_KEPT_OPS`) kept in float32. Return the names of the nodes kept in float32 by name:
    the logits projection and the nodes computing the search's outputs from the logits
    (export/top_outputs.py), so that TopK ranks the float32 logits as in the float32 graph."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = load_graph(source)
    top = {node.name for node in model.graph.node if node.name.startswith(C.TOP_NODE_PREFIX)}
    kept_nodes = sorted(logits_nodes(model) | top)
    converted = convert_float_to_float16(
        model,
        keep_io_types=fp32_io_names(model.graph),
        op_block_list=[*DEFAULT_OP_BLOCK_LIST, *fp32_ops],
        node_block_list=kept_nodes,
    )
    merge_duplicate_casts(converted.graph)
    skip_cast_round_trips(converted.graph)
    save_graph(converted, target)
    return kept_nodes


def fp32_io_names(graph: onnx.GraphProto) -> list[str]:
    """The inputs and outputs of `graph` that stay as they are in its float16 version: all
    but the cache (`C.is_cache`)."""
    names = [value.name for value in (*graph.input, *graph.output)]
    return [name for name in names if not C.is_cache(name)]


def fp16_ops(fp32_ops: Sequence[str]) -> str:
    """Words for an fp16 conversion's float32 operator types, for progress lines."""
    return f"{', '.join(fp32_ops)} in float32" if fp32_ops else "every operator in float16"


def merge_duplicate_casts(graph: onnx.GraphProto) -> int:
    """Drop from `graph` each Cast node identical to an earlier one (name, input, output and
    target type) and each repeated `value_info` entry; return the number of Casts dropped.
    The readers of the dropped Casts' output read the kept one's, which has the same name."""
    seen: set[tuple[str, tuple[str, ...], tuple[str, ...], bytes]] = set()
    nodes = []
    for node in graph.node:
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
            key = (node.name, tuple(node.input), tuple(node.output), _attributes(node))
            if key in seen:
                continue
            seen.add(key)
        nodes.append(node)
    dropped = len(graph.node) - len(nodes)
    if dropped:
        del graph.node[:]
        graph.node.extend(nodes)
        infos = list({info.name: info for info in reversed(graph.value_info)}.values())[::-1]
        del graph.value_info[:]
        graph.value_info.extend(infos)
    return dropped


def skip_cast_round_trips(graph: onnx.GraphProto) -> int:
    """Let the float32 readers of a float32-kept node's output read it unrounded; return the
    number of round trips skipped. The converter casts such an output to float16 and each
    float32 reader's input back (`X_cast_to_fp16` -> Cast -> `X` -> Cast -> `X_cast_to_fp32`),
    which rounds what two kept nodes pass each other: the logits on their way to the graph
    output and to the search's outputs, and every step between those. Each Cast back becomes
    an Identity of the float32 tensor (its output name kept); a float16 Cast that nothing
    reads any more is dropped."""
    producer = {out: node for node in graph.node for out in node.output}
    nodes, skipped = [], 0
    for node in graph.node:
        before = producer.get(node.input[0]) if _is_cast(node, onnx.TensorProto.FLOAT) else None
        if before is not None and _is_converter_fp16_cast(before):
            node = onnx.helper.make_node("Identity", [before.input[0]], node.output, node.name)
            skipped += 1
        nodes.append(node)
    read = {name for node in nodes for name in _inputs(node)} | {o.name for o in graph.output}
    nodes = [n for n in nodes if not (_is_converter_fp16_cast(n) and n.output[0] not in read)]
    del graph.node[:]
    graph.node.extend(nodes)
    produced = {name for node in nodes for name in node.output}
    infos = [info for info in graph.value_info if info.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return skipped


def _is_cast(node: onnx.NodeProto, to: int) -> bool:
    """Whether `node` is an ONNX Cast to element type `to`."""
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return False
    return any(a.name == "to" and a.i == to for a in node.attribute)


def _is_converter_fp16_cast(node: onnx.NodeProto) -> bool:
    """Whether `node` is a Cast the float16 converter put after a float32-kept node's output
    (named `OUTPUT_cast_to_fp16_node`, reading the float32 `OUTPUT_cast_to_fp16`)."""
    return (
        _is_cast(node, onnx.TensorProto.FLOAT16)
        and node.name.endswith("_cast_to_fp16_node")
        and node.input[0] == node.name.removesuffix("_node")
    )


def _inputs(node: onnx.NodeProto) -> Iterator[str]:
    """The tensor names `node` reads, those of its subgraphs' nodes included."""
    yield from node.input
    for attribute in node.attribute:
        for graph in [attribute.g, *attribute.graphs] if attribute.type in SUBGRAPHS else []:
            for inner in graph.node:
                yield from _inputs(inner)


def _attributes(node: onnx.NodeProto) -> bytes:
    """The serialized attributes of `node`, in name order (a comparable key)."""
    return b"".join(a.SerializeToString() for a in sorted(node.attribute, key=lambda a: a.name))


class GraphLoadError(EdgeseqError):
    """onnxruntime cannot load a graph the exporter wrote."""


def check_loads(paths: Sequence[str | Path], variant: str) -> None:
    """Open each graph file in `paths` (the `variant`'s) on onnxruntime's CPU provider;
    GraphLoadError naming the first that does not load, with onnxruntime's reason."""
    import onnxruntime as ort

    for path in paths:
        try:
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            reason = " ".join(str(exc).split())
            raise GraphLoadError(
                f"the {variant} graph {Path(path).name} does not load in onnxruntime "
                f"{ort.__version__} (CPU provider): {reason}; export without {variant} and "
                "report this"
            ) from None


def fp16_note() -> str:
    """The fp16 entry's note on a gated variant: where the gate ran and what it leaves
    unchecked (the numerics of the CUDA provider, where fp16 is meant to run)."""
    if gpu_present():
        return f"{FP16_CPU_NOTE}; CUDA numerics not checked: the gate runs on the CPU provider"
    return f"{FP16_CPU_NOTE}; CUDA numerics not checked: no GPU"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Swallow the converter's prints and INFO log lines."""
    logging.disable(logging.INFO)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def convert_ort(sources: Sequence[str | Path], out_dir: str | Path) -> tuple[list[Path], Path]:
    """Convert the ONNX graphs `sources` to ORT format into `out_dir` (`NAME.onnx` ->
    `NAME.ort`) and write `required_operators.config` there for both together; return the
    .ort paths and the config path."""
    from onnxruntime.tools.convert_onnx_models_to_ort import (
        OptimizationStyle,
        convert_onnx_models_to_ort,
    )

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".ort-") as scratch:
        work = Path(scratch) / "in"
        converted = Path(scratch) / "out"
        work.mkdir()
        for source in sources:  # the converter takes a directory of .onnx files
            shutil.copy(source, work / Path(source).name)
            if has_external_data(source):  # read beside the graph; the .ort holds it all
                shutil.copy(data_file(source), work / data_file(source).name)
        with _quiet():
            convert_onnx_models_to_ort(
                work, output_dir=converted, optimization_styles=[OptimizationStyle.Fixed]
            )
        outputs = []
        for source in sources:
            name = Path(source).with_suffix(".ort").name
            shutil.move(converted / name, out_dir / name)
            outputs.append(out_dir / name)
        config = out_dir / REQUIRED_OPERATORS_FILE
        config.write_text(_portable_config(converted / REQUIRED_OPERATORS_FILE), encoding="utf-8")
    return outputs, config


def _portable_config(path: Path) -> str:
    """The config text with the converter's absolute (temporary) model paths in its
    comments replaced by the bare file names."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# - "):
            line = "# - " + Path(line[4:]).name
        lines.append(line)
    return "\n".join(lines) + "\n"
