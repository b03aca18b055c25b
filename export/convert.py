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

from .external_data import load_graph, save_graph
from .quantize import logits_nodes
from .top_outputs import strip_top_outputs

FP16_KEPT_OPS = ("Softmax", "LayerNormalization")
REQUIRED_OPERATORS_FILE = "required_operators.config"


def convert_fp16(source: str | Path, target: str | Path) -> list[str]:
    """Write the float16 version of graph `source` to `target` (float32 inputs and outputs
    kept, the search's outputs left out); return the names of the nodes kept in float32 by
    name (the logits projection)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = load_graph(source)
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
    save_graph(converted, target)
    return kept_nodes


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
