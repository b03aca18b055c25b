"""Export a PyTorch module to one ONNX graph of the bundle contract with
`torch.onnx.export(dynamo=True)`: every kind's graphs go through here.

    info = export_module(module, args, dynamic, (inputs, outputs), cfg, "decoder", path, opset)

The fused wrappers' attention operators are translated by export/fused_ops.py. Each graph is
checked with `onnx.checker.check_model(full_check=True)`, its input and output names are
compared with the constants, key config values go into `metadata_props`, and the weights
are stored inside the .onnx file, or beside it once they pass a threshold
(export/external_data.py). A model the exporter cannot translate, or too large for this
machine's memory, ends in an ExportError saying so.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx.external_data_helper import uses_external_data

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import EdgeseqError

from .external_data import (
    data_file,
    external_data_threshold,
    external_location,
    graph_bytes,
    ir_weight_bytes,
    save_graph,
    stream_weights,
)
from .fused_ops import TRANSLATIONS
from .fused_relative_ops import TRANSLATIONS as RELATIVE_TRANSLATIONS

MIN_OPSET = 18  # oldest opset the exporter's translations are tested with


METADATA_KEYS = (
    "src_vocab_size",
    "tgt_vocab_size",
    "d_model",
    "n_heads",
    "n_encoder_layers",
    "n_decoder_layers",
    "d_ff",
    "max_len",
    "positional",
    "norm",
    "activation",
    "tie_output",
    "pad_id",
    "bos_id",
    "eos_id",
    "unk_id",
)
ONNX_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64"}
ONNX_DTYPES[onnx.TensorProto.BOOL] = "bool"
ONNX_DTYPES[onnx.TensorProto.FLOAT16] = "float16"
ONNX_DTYPES[onnx.TensorProto.INT32] = "int32"


class ExportError(EdgeseqError):
    """The exporter produced a graph that breaks the bundle contract (names, opset, data)."""


@dataclass
class GraphInfo:
    """What `export_module` wrote."""

    path: Path
    bytes: int
    seconds: float
    opset: int
    ir_version: int
    inputs: list[dict[str, Any]] = field(default_factory=list)  # {"name", "dtype", "shape"}
    outputs: list[dict[str, Any]] = field(default_factory=list)


def edgeseq_version() -> str:
    """Installed edgeseq version ("unknown" when run from an uninstalled tree)."""
    try:
        return metadata.version("edgeseq")
    except metadata.PackageNotFoundError:
        return "unknown"


@contextlib.contextmanager
def quiet_exporter() -> Iterator[io.StringIO]:
    """Silence the exporter's progress prints, warnings and log lines (errors still raise).

    Yields the captured stdout; when the block raises, it is replayed on stderr."""
    captured = io.StringIO()
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(captured):
            warnings.simplefilter("ignore")
            yield captured
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _export(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    dynamic_shapes: dict[str, Any],
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    opset: int | None,
    graph: str = "model",
    path: Path | None = None,
) -> onnx.ModelProto:
    """Run the dynamo exporter quietly and return the model: its weights embedded, or, with
    `path`, when they reach the external data threshold, already written to `path`'s data
    file (`stream_weights`) and referenced from there. The fused wrappers' attention ops are
    translated by `fused_ops.TRANSLATIONS` (and `fused_relative_ops`' for a score bias).
    ExportError when the exporter fails (an operation or layout it cannot translate) or
    memory runs out."""
    if opset is not None and opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old; use --opset {MIN_OPSET} or newer")
    try:
        program = _run_exporter(module, args, dynamic_shapes, input_names, output_names, opset)
        if path is not None and ir_weight_bytes(program.model) >= external_data_threshold():
            return stream_weights(program.model, path)
        return program.model_proto
    except MemoryError:
        params = sum(p.numel() * p.element_size() for p in module.parameters())
        raise ExportError(
            f"not enough memory to export the {graph} graph ({params / 1e9:.2f} GB of weights, "
            "held several times while exporting): export on a machine with more memory"
        ) from None
    except EdgeseqError:
        raise
    except Exception as exc:  # torch.onnx's and torch.export's many error types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ExportError(
            f"torch.onnx.export cannot export the {graph} graph ({type(exc).__name__}: "
            f"{first[:300]}): the model has an operation or layout the exporter does not "
            "translate; try --no-fuse, or report it with this message"
        ) from exc


def _run_exporter(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    dynamic_shapes: dict[str, Any],
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    opset: int | None,
) -> torch.onnx.ONNXProgram:
    with quiet_exporter(), torch.no_grad():
        program = torch.onnx.export(
            module.eval(),
            args,
            dynamo=True,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic_shapes,
            opset_version=opset,
            optimize=True,
            custom_translation_table=TRANSLATIONS | RELATIVE_TRANSLATIONS,
        )
        return program


def value_info(values: Any) -> list[dict[str, Any]]:
    """[{"name", "dtype", "shape"}] of graph inputs/outputs; symbolic dims as their names."""
    out = []
    for value in values:
        tensor_type = value.type.tensor_type
        shape = [d.dim_param if d.dim_param else d.dim_value for d in tensor_type.shape.dim]
        dtype = ONNX_DTYPES.get(tensor_type.elem_type, str(tensor_type.elem_type))
        out.append({"name": value.name, "dtype": dtype, "shape": shape})
    return out


def finish_graph(
    proto: onnx.ModelProto,
    path: str | Path,
    cfg: ModelConfig,
    graph: str,
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    metadata: dict[str, str] | None = None,
) -> tuple[int, int, list[dict[str, Any]], list[dict[str, Any]]]:
    """Check names and data location, add metadata (the config values of METADATA_KEYS and
    `metadata`, e.g. the vocabulary fingerprints), full-check and save `proto` to `path`
    (its weights in `path`.data when they pass the threshold: export/external_data.py).

    Returns (opset, ir_version, inputs, outputs)."""
    got_in = tuple(v.name for v in proto.graph.input)
    got_out = tuple(v.name for v in proto.graph.output)
    if got_in != input_names or got_out != output_names:
        raise ExportError(
            f"{graph} graph has inputs {got_in} and outputs {got_out}; the bundle contract "
            f"(runtime/constants.py) needs {input_names} and {output_names}"
        )
    own = data_file(path).name  # where stream_weights wrote the weights, if it did
    external = [
        t.name
        for t in proto.graph.initializer
        if uses_external_data(t) and external_location(t) != own
    ]
    if external:
        raise ExportError(f"{graph} graph keeps weights in external files: {external[:3]}")
    strip_stack_traces(proto.graph)
    values = {key: getattr(cfg, key) for key in METADATA_KEYS}
    values.update(graph=graph, edgeseq_version=edgeseq_version(), d_head=cfg.d_head)
    props = {
        f"edgeseq.{key}": str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in values.items()
    }
    props |= metadata or {}
    del proto.metadata_props[:]
    for key, value in sorted(props.items()):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.producer_name = f"edgeseq {edgeseq_version()} via {proto.producer_name or 'torch'}"
    save_graph(proto, path, check="full")
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return opset, proto.ir_version, value_info(proto.graph.input), value_info(proto.graph.output)


def export_module(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    dynamic_shapes: dict[str, Any],
    names: tuple[tuple[str, ...], tuple[str, ...]],
    cfg: ModelConfig,
    graph: str,
    path: str | Path,
    opset: int | None,
    metadata: dict[str, str] | None = None,
    edit: Callable[[onnx.ModelProto], None] | None = None,
) -> GraphInfo:
    """Export `module` on example `args` to `path` (`dynamic_shapes` as torch.export takes
    them, `names`: (input names, output names) of the bundle contract) and finish it as
    `finish_graph` does; `graph` is its role ("encoder", "decoder", "model"). `edit` changes
    the exported graph in place first; outputs it appends follow `names`' (the search's
    outputs: export/top_outputs.py)."""
    start = time.perf_counter()
    proto = _export(module, args, dynamic_shapes, *names, opset, graph, Path(path))
    output_names = names[1]
    if edit is not None:
        edit(proto)
        output_names += tuple(o.name for o in proto.graph.output[len(output_names) :])
    opset_used, ir_version, inputs, outputs = finish_graph(
        proto, path, cfg, graph, names[0], output_names, metadata
    )
    path = Path(path)
    seconds = time.perf_counter() - start
    return GraphInfo(path, graph_bytes(path), seconds, opset_used, ir_version, inputs, outputs)


STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def strip_stack_traces(graph: onnx.GraphProto) -> None:
    """Drop the exporter's per-node Python stack traces (`pkg.torch.onnx.stack_trace`
    metadata): they name source files by the exporting machine's absolute paths, and a
    bundle must be portable. Subgraphs (If/Loop/Scan bodies) are walked too."""
    for node in graph.node:
        kept = [p for p in node.metadata_props if p.key != STACK_TRACE_KEY]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
        for attribute in node.attribute:
            for subgraph in (attribute.g, *attribute.graphs):
                strip_stack_traces(subgraph)
