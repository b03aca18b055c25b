"""Where a graph's weights are saved: inside its .onnx file, or beside it as ONNX external data
once they pass a threshold. Every graph file of every kind and variant is saved here.

    save_graph(proto, "b/decoder.onnx", check="full")  # decoder.onnx (+ decoder.onnx.data)
    graph_bytes("b/decoder.onnx")                       # both files' bytes
    settle_external_data("b/decoder.int8.onnx")         # after the quantizer wrote it

A graph whose initializers reach `external_data_threshold()` (EXTERNAL_DATA_BYTES, 64 MiB,
unless the environment variable EDGESEQ_EXTERNAL_DATA_MB sets it in MiB; 0 sends every
graph's weights out, as the tests do) keeps them in one file named after it,
`<graph file>.data` (`decoder.onnx.data`), tensors under SMALL_TENSOR_BYTES staying inside.
Two reasons: protobuf cannot serialise a message over 2 GiB, and onnxruntime memory-maps an
external data file where it parses weights inside the graph into its heap, so a weight that
is only read (an embedding table, whose rows a `Gather` touches as tokens come) or that is
prepacked at load (and then released) costs no heap copy (docs/experiments-marian.md,
"Weights in external data"). A graph below the threshold is saved as before: one file, the
same bytes. The data file is a bundle file like any other (manifest.json lists its sha256;
docs/bundle-large.md), and onnxruntime reads it when a graph is opened by its path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import onnx
import onnx_ir as ir
from google.protobuf.message import EncodeError
from onnx.external_data_helper import (
    load_external_data_for_model,
    set_external_data,
    uses_external_data,
)

from edgeseq.runtime.errors import EdgeseqError
from edgeseq.runtime.external_data import data_file_name

from .tied_projection import join_projections, split_projections

EXTERNAL_DATA_BYTES = 64 << 20  # initializers from which onnxruntime's memory map pays
EXTERNAL_DATA_ENV = "EDGESEQ_EXTERNAL_DATA_MB"
SMALL_TENSOR_BYTES = 1024  # tensors smaller than this stay in the graph file (onnx's default)
PROTOBUF_LIMIT = 2 << 30

Check = Literal["none", "basic", "full"]


class GraphSizeError(EdgeseqError):
    """A graph cannot be written as asked: too large for one protobuf file, or for a format."""


def external_data_threshold() -> int:
    """Initializer bytes from which a graph keeps its weights in a data file: the MiB (may be
    fractional) of the environment variable EXTERNAL_DATA_ENV when set, else
    EXTERNAL_DATA_BYTES. GraphSizeError for a value that is not a number >= 0."""
    text = os.environ.get(EXTERNAL_DATA_ENV, "").strip()
    if not text:
        return EXTERNAL_DATA_BYTES
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = -1.0
    if not math.isfinite(megabytes) or megabytes < 0:
        raise GraphSizeError(
            f"{EXTERNAL_DATA_ENV} is {text!r}: set it to a number of MiB (e.g. 1024) or unset it"
        )
    return int(megabytes * (1 << 20))


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The initializers of `graph` and of every subgraph in its nodes' attributes."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in (attribute.g, *attribute.graphs):
                yield from _tensors(subgraph)


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers of `model` (subgraphs included), wherever they are stored."""
    total = 0
    for tensor in _tensors(model.graph):
        if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            continue
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        total += math.prod(tensor.dims) * itemsize
    return total


def data_file(path: str | Path) -> Path:
    """The external data file of the graph at `path`: `decoder.onnx` -> `decoder.onnx.data`."""
    path = Path(path)
    return path.with_name(data_file_name(path.name))


def graph_bytes(path: str | Path) -> int:
    """Bytes of the graph at `path` and of its data file, when it has one."""
    path, data = Path(path), data_file(path)
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def has_external_data(path: str | Path) -> bool:
    """Whether the graph at `path` keeps its weights in a data file."""
    return data_file(path).is_file()


def _too_large(path: Path, exc: Exception) -> GraphSizeError:
    threshold = external_data_threshold()
    return GraphSizeError(
        f"{path.name} cannot be written as one protobuf file (protobuf's limit is 2 GiB: "
        f"{exc}); its weights go to {data_file(path).name} from "
        f"{threshold / (1 << 20):.0f} MiB: set {EXTERNAL_DATA_ENV} below 2048 or unset it"
    )


def ir_weight_bytes(model: ir.Model) -> int:
    """Bytes of the initializers of the exporter's in-memory `model` (onnx_ir), subgraphs'
    included: what `weight_bytes` counts once it is a protobuf message."""
    return sum(
        value.const_value.nbytes
        for graph in (model.graph, *model.graph.subgraphs())
        for value in graph.initializers.values()
        if value.const_value is not None
    )


def stream_weights(model: ir.Model, path: str | Path) -> onnx.ModelProto:
    """Write the weights of the exporter's in-memory `model` straight to `data_file(path)`
    (tensors from SMALL_TENSOR_BYTES; read from PyTorch's memory, never copied into a
    protobuf message, which for an NLLB-200-sized graph would be one more copy of its 1 GB
    embedding) and return the graph as a message whose initializers point there, for
    `save_graph` to finish once it is edited."""
    path = Path(path)
    data = data_file(path)
    data.unlink(missing_ok=True)
    ir.save(model, path, external_data=data.name, size_threshold_bytes=SMALL_TENSOR_BYTES)
    return onnx.load(str(path), load_external_data=False)


def external_location(tensor: onnx.TensorProto) -> str | None:
    """The `location` of an external tensor's data (None when it has none)."""
    return next((e.value for e in tensor.external_data if e.key == "location"), None)


def _written_already(model: onnx.ModelProto, data: Path) -> bool:
    """Whether `model`'s weights were written to `data` by `stream_weights`: it has external
    tensors, and every one names that file."""
    tensors = [t for t in _tensors(model.graph) if uses_external_data(t)]
    return bool(tensors) and {external_location(t) for t in tensors} == {data.name}


def _append_large_tensors(model: onnx.ModelProto, data: Path) -> None:
    """Move the embedded tensors of SMALL_TENSOR_BYTES or more (added after `stream_weights`,
    e.g. by a graph edit) to the end of `data`, so that only small ones stay in the graph."""
    with data.open("ab") as out:
        for tensor in _tensors(model.graph):
            if uses_external_data(tensor) or len(tensor.raw_data) < SMALL_TENSOR_BYTES:
                continue
            offset = out.tell()
            out.write(tensor.raw_data)
            set_external_data(tensor, data.name, offset, len(tensor.raw_data))  # marks it EXTERNAL
            tensor.ClearField("raw_data")


def save_graph(model: onnx.ModelProto, path: str | Path, *, check: Check = "none") -> None:
    """Save `model` at `path`, its weights in `data_file(path)` when `weight_bytes` reaches
    `external_data_threshold()` (they then move out of `model`, which keeps only their
    locations; a message from `stream_weights` has them there already); `check` runs onnx's
    checker first ("basic") or with shape inference ("full"), on the saved file for a graph
    with external data. GraphSizeError when protobuf cannot serialise it."""
    path = Path(path)
    data = data_file(path)
    if _written_already(model, data):
        _append_large_tensors(model, data)
        split_projections(model)
        onnx.save_model(model, str(path), save_as_external_data=False)
        data.chmod(path.stat().st_mode & 0o777)
        if check != "none":
            onnx.checker.check_model(str(path), full_check=check == "full")
        return
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    try:
        if weight_bytes(model) < external_data_threshold():
            if check != "none":
                onnx.checker.check_model(model, full_check=check == "full")
            onnx.save_model(model, str(path), save_as_external_data=False)
            return
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=SMALL_TENSOR_BYTES,
        )
        # onnx creates the data file readable by its owner only (0600): give it the graph's
        # permissions, or a bundle copied for another user would open without its weights
        data.chmod(path.stat().st_mode & 0o777)
        saved = onnx.load(str(path), load_external_data=False)
        if split_projections(saved):
            onnx.save_model(saved, str(path), save_as_external_data=False)
        if check != "none":  # a path: the checker reads a model over 2 GiB only from a file
            onnx.checker.check_model(str(path), full_check=check == "full")
    except EncodeError as exc:
        raise _too_large(path, exc) from exc
    except ValueError as exc:
        if "2GB" not in str(exc) and "2 GB" not in str(exc):
            raise
        raise _too_large(path, exc) from exc


def load_graph(path: str | Path) -> onnx.ModelProto:
    """The graph at `path` with its weights in memory, read from its data file when it has one,
    in the exporter's form (a tied projection saved in blocks joined again: `join_projections`)."""
    model = onnx.load(str(path), load_external_data=False)
    join_projections(model)
    load_external_data_for_model(model, str(Path(path).parent))
    return model


def settle_external_data(path: str | Path) -> None:
    """Re-save a graph another tool wrote with external data (the quantizer, as
    `<path>.data` too) by `save_graph`'s rule: its weights back inside when under the
    threshold, else in its data file."""
    save_graph(load_graph(path), path)


def refuse_unsupported_variants(paths: Sequence[str | Path], variants: Sequence[str]) -> None:
    """GraphSizeError when `variants` asks for a conversion the fp32 graphs at `paths` are too
    large for: the ORT format of a graph of 2 GiB or more (an ORT file is one flatbuffer
    holding every weight; the search graph holds the weights of all `paths`, so their sum
    counts with `search`), fp16 of a graph of 2 GiB or more (onnxruntime's float16 converter
    infers shapes on the whole graph in memory, which protobuf cannot serialise)."""
    huge = [Path(p).name for p in paths if graph_bytes(p) >= PROTOBUF_LIMIT]
    together = sum(graph_bytes(p) for p in paths)
    too_large = [*huge]
    if "search" in variants and together >= PROTOBUF_LIMIT:
        too_large.append(f"the search graph of {', '.join(Path(p).name for p in paths)}")
    if too_large and "ort" in variants:
        raise GraphSizeError(
            f"{', '.join(too_large)} hold 2 GiB or more, which the ORT format (one flatbuffer, "
            "2 GiB at most) cannot hold: leave ort out of --variants"
        )
    if huge and "fp16" in variants:
        raise GraphSizeError(
            f"{', '.join(huge)} hold 2 GiB or more, which the fp16 conversion cannot read "
            "(it infers shapes on the whole graph as one protobuf message): leave fp16 out of "
            "--variants"
        )
