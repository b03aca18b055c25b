"""fp16 graphs and ORT-format graphs, converted from a bundle's fp32 graphs.

    kept = convert_fp16("b/decoder.onnx", "b/decoder.fp16.onnx")     # names kept in fp32
    convert_ort(["b/encoder.onnx", "b/decoder.onnx"], "b")           # *.ort + config

**fp16** uses the converter shipped with onnxruntime (`onnxruntime.transformers.float16`,
the same code as onnxconverter-common's, so no extra dependency): weights and activations
become float16, while

- the graph inputs and outputs keep their types (`keep_io_types`): the decoder still takes
  and returns a float32 cache, so the runtime feeds every variant the same way; Casts at the
  graph boundary convert;
- `Softmax`, `LayerNormalization` (numerically sensitive: exponent and variance) and the
  output projection computing `logits` stay float32, with Casts around them.

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

from edgeseq.runtime.errors import EdgeseqError
from edgeseq.runtime.providers import gpu_present

from .quantize import logits_nodes
from .top_outputs import strip_top_outputs

FP16_KEPT_OPS = ("Softmax", "LayerNormalization")
REQUIRED_OPERATORS_FILE = "required_operators.config"
FP16_CPU_NOTE = (
    "gate measured on onnxruntime's CPU provider, which runs the fp16 nodes it has no fp16 "
    "kernel for in fp32 (inserted Casts)"
)


def convert_fp16(source: str | Path, target: str | Path) -> list[str]:
    """Write the float16 version of graph `source` to `target` (float32 inputs and outputs
    kept, the search's outputs left out); return the names of the nodes kept in float32 by
    name (the logits projection)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(source))
    # Without the search's outputs: the converter casts around each kept node, so a chain of
    # them would go through float16 anyway (and breaks on a tensor two kept nodes read);
    # fp16 graphs give the searches their logits (docs/bundle.md).
    strip_top_outputs(model.graph)
    kept_nodes = sorted(logits_nodes(model))
    converted = convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=[*DEFAULT_OP_BLOCK_LIST, *FP16_KEPT_OPS],
        node_block_list=kept_nodes,
    )
    merge_duplicate_casts(converted.graph)
    onnx.save(converted, str(target))
    return kept_nodes


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
