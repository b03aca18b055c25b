"""Export the encoder and decoder-step graphs with `torch.onnx.export(dynamo=True)`.

    encoder_info = export_encoder(model, "b/encoder.onnx")     # GraphInfo: sizes, time, io
    decoder_info = export_decoder(model, "b/decoder.onnx", opset=20)

Every axis named in `runtime/constants.py` (batch, src_len, past_len, new_len) is dynamic.
The dynamo exporter specialises an axis whose example size is 0 or 1, so the example inputs
use sizes >= 2 everywhere (past_len = 0 is tested afterwards, not traced). Each graph is
checked with `onnx.checker.check_model(full_check=True)`, its input and output names are
compared with the constants, key config values go into `metadata_props`, and the weights
are stored inside the .onnx file (no external data).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx.external_data_helper import uses_external_data
from torch.export import Dim

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import EdgeseqError

from .fused_ops import TRANSLATIONS
from .wrappers import FusedDecoderStep, FusedEncoder, OnnxDecoderStep, OnnxEncoder

MIN_OPSET = 18  # oldest opset the exporter's translations are tested with
EXAMPLE_SIZE = {C.BATCH: 2, C.SRC_LEN: 5, C.PAST_LEN: 3, C.NEW_LEN: 2}  # all >= 2: see above


def example_sizes(cfg: ModelConfig) -> dict[str, int]:
    """EXAMPLE_SIZE fitted to the positional table: src_len <= max_len and past_len + new_len
    <= max_len, every size >= 2 (ModelConfig requires max_len >= 4 for this)."""
    sizes = dict(EXAMPLE_SIZE)
    sizes[C.SRC_LEN] = min(sizes[C.SRC_LEN], cfg.max_len)
    sizes[C.PAST_LEN] = min(sizes[C.PAST_LEN], cfg.max_len - sizes[C.NEW_LEN])
    return sizes


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
    """What `export_encoder` / `export_decoder` wrote."""

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


def _dims(cfg: ModelConfig) -> dict[str, Dim]:
    """The dynamic axes, bounded by the positional table where positions are involved."""
    return {
        C.BATCH: Dim(C.BATCH, min=1),
        C.SRC_LEN: Dim(C.SRC_LEN, min=1, max=cfg.max_len),
        C.PAST_LEN: Dim(C.PAST_LEN, min=0, max=cfg.max_len),
        C.NEW_LEN: Dim(C.NEW_LEN, min=1, max=cfg.max_len),
    }


def _export(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    dynamic_shapes: dict[str, Any],
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    opset: int | None,
) -> onnx.ModelProto:
    """Run the dynamo exporter quietly and return the in-memory model (weights embedded).
    The fused wrappers' attention ops are translated by `fused_ops.TRANSLATIONS`."""
    if opset is not None and opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old; use --opset {MIN_OPSET} or newer")
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
            custom_translation_table=TRANSLATIONS,
        )
        return program.model_proto


def _value_info(values: Any) -> list[dict[str, Any]]:
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
    `metadata`, e.g. the vocabulary fingerprints), full-check and save `proto` to `path`.

    Returns (opset, ir_version, inputs, outputs)."""
    got_in = tuple(v.name for v in proto.graph.input)
    got_out = tuple(v.name for v in proto.graph.output)
    if got_in != input_names or got_out != output_names:
        raise ExportError(
            f"{graph} graph has inputs {got_in} and outputs {got_out}; the bundle contract "
            f"(runtime/constants.py) needs {input_names} and {output_names}"
        )
    external = [t.name for t in proto.graph.initializer if uses_external_data(t)]
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
    onnx.checker.check_model(proto, full_check=True)
    onnx.save_model(proto, str(path), save_as_external_data=False)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return opset, proto.ir_version, _value_info(proto.graph.input), _value_info(proto.graph.output)


def _run(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    dynamic_shapes: dict[str, Any],
    names: tuple[tuple[str, ...], tuple[str, ...]],
    cfg: ModelConfig,
    graph: str,
    path: str | Path,
    opset: int | None,
    metadata: dict[str, str] | None = None,
) -> GraphInfo:
    start = time.perf_counter()
    proto = _export(module, args, dynamic_shapes, *names, opset)
    opset_used, ir_version, inputs, outputs = finish_graph(
        proto, path, cfg, graph, *names, metadata
    )
    path = Path(path)
    seconds = time.perf_counter() - start
    return GraphInfo(path, path.stat().st_size, seconds, opset_used, ir_version, inputs, outputs)


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
    cfg, dims, sizes = model.cfg, _dims(model.cfg), example_sizes(model.cfg)
    batch, src_len = sizes[C.BATCH], sizes[C.SRC_LEN]
    src_ids = torch.randint(len(C.SPECIAL_TOKENS), cfg.src_vocab_size, (batch, src_len))
    dynamic = {C.SRC_IDS: {0: dims[C.BATCH], 1: dims[C.SRC_LEN]}}
    names = (C.ENCODER_INPUTS, C.encoder_outputs(cfg.n_decoder_layers))
    module = FusedEncoder(model) if fuse else OnnxEncoder(model)
    return _run(module, (src_ids,), dynamic, names, cfg, "encoder", path, opset, metadata)


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
    cfg, dims = model.cfg, _dims(model.cfg)
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
    return _run(module, args, dynamic, names, cfg, "decoder", path, opset, metadata)
