"""Read what the runtime checks before opening a graph straight from an .onnx file's
protobuf, without onnx or a session: its `metadata_props`, its inputs' and outputs' names and
where its tensors keep external data.

    read_onnx_metadata("b/decoder.onnx")       # {"edgeseq.source_vocab_sha256": "…", ...}
    read_onnx_io("b/decoder.steps.onnx")       # (("input_ids", ...), ("logits", ...))
    read_onnx_external_data("b/decoder.onnx")  # [ExternalTensor("w", "decoder.onnx.data", ...)]

Fields are walked with seeks over the ones not needed (initializers are most of a file), so
a check reads kilobytes of a graph of any size. Field numbers are onnx.proto's.
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .errors import BundleError

# ModelProto: graph, metadata_props; GraphProto: input, output; ValueInfoProto: name;
# StringStringEntryProto: key, value.
MODEL_GRAPH, MODEL_METADATA_PROPS = 7, 14
GRAPH_INPUT, GRAPH_OUTPUT = 11, 12
VALUE_INFO_NAME = 1
ENTRY_KEY, ENTRY_VALUE = 1, 2
# GraphProto: node, initializer, sparse_initializer; NodeProto: attribute; AttributeProto:
# t, g, tensors, graphs, sparse_tensor, sparse_tensors; SparseTensorProto: values, indices;
# TensorProto: name, external_data.
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_SPARSE_INITIALIZER = 1, 5, 15
NODE_ATTRIBUTE = 5
ATTRIBUTE_TENSOR, ATTRIBUTE_GRAPH, ATTRIBUTE_TENSORS, ATTRIBUTE_GRAPHS = 5, 6, 10, 11
ATTRIBUTE_SPARSE_TENSOR, ATTRIBUTE_SPARSE_TENSORS = 22, 23
SPARSE_VALUES, SPARSE_INDICES = 1, 2
TENSOR_NAME, TENSOR_EXTERNAL_DATA = 8, 13
EXTERNAL_LOCATION_KEY = b"location"


@dataclass(frozen=True)
class ExternalTensor:
    """A tensor whose bytes are in another file: `location` relative to the graph's folder,
    `offset` and `length` in bytes (None when the entry has none: from 0, to the end)."""

    name: str
    location: str
    offset: int | None
    length: int | None


def _varint(read: IO[bytes]) -> int:
    value, shift = 0, 0
    while True:
        byte = read.read(1)
        if not byte or shift > 63:
            raise ValueError("truncated varint")
        value |= (byte[0] & 0x7F) << shift
        shift += 7
        if byte[0] < 0x80:
            return value


def _fields(fh: IO[bytes], end: int, wanted: set[int]) -> Iterator[tuple[int, int]]:
    """(field number, length) of each length-delimited field in `wanted` up to offset `end`,
    with `fh` at the field's bytes; the caller reads or seeks past them. Others are skipped."""
    while fh.tell() < end:
        tag = _varint(fh)
        wire = tag & 7
        if wire == 0:
            _varint(fh)
        elif wire in (1, 5):
            fh.seek(8 if wire == 1 else 4, os.SEEK_CUR)
        elif wire == 2:
            length = _varint(fh)
            start = fh.tell()
            if tag >> 3 in wanted:
                yield tag >> 3, length
            fh.seek(start + length)
        else:
            raise ValueError(f"wire type {wire}")


def _strings(data: bytes, wanted: set[int]) -> dict[int, str]:
    """The string fields `wanted` of a small serialised message."""
    stream, found = io.BytesIO(data), {}
    for field, length in _fields(stream, len(data), wanted):
        found[field] = stream.read(length).decode("utf-8")
    return found


def _read(path: str | Path, walk: object) -> object:
    try:
        with open(path, "rb") as fh:
            return walk(fh, os.fstat(fh.fileno()).st_size)  # type: ignore[operator]
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BundleError(f"{path} is not an ONNX model ({exc}); re-export the bundle") from None


def read_onnx_metadata(path: str | Path) -> dict[str, str]:
    """The `metadata_props` of an .onnx file; BundleError when it does not parse."""

    def walk(fh: IO[bytes], size: int) -> dict[str, str]:
        out = {}
        for _, length in _fields(fh, size, {MODEL_METADATA_PROPS}):
            entry = _strings(fh.read(length), {ENTRY_KEY, ENTRY_VALUE})
            out[entry.get(ENTRY_KEY, "")] = entry.get(ENTRY_VALUE, "")
        return out

    return _read(path, walk)  # type: ignore[return-value]


def read_onnx_io(path: str | Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(input names, output names) of an .onnx file's main graph; BundleError when it does
    not parse."""

    def walk(fh: IO[bytes], size: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        names: dict[int, list[str]] = {GRAPH_INPUT: [], GRAPH_OUTPUT: []}
        for _, graph_length in _fields(fh, size, {MODEL_GRAPH}):
            end = fh.tell() + graph_length
            for field, length in _fields(fh, end, {GRAPH_INPUT, GRAPH_OUTPUT}):
                value = _strings(fh.read(length), {VALUE_INFO_NAME})
                names[field].append(value.get(VALUE_INFO_NAME, ""))
        return tuple(names[GRAPH_INPUT]), tuple(names[GRAPH_OUTPUT])

    return _read(path, walk)  # type: ignore[return-value]


def _tensor(fh: IO[bytes], end: int, found: list[ExternalTensor]) -> None:
    """Append the TensorProto up to `end` to `found` when it names external data."""
    name, entries = "", {}
    for field, length in _fields(fh, end, {TENSOR_NAME, TENSOR_EXTERNAL_DATA}):
        if field == TENSOR_NAME:
            name = fh.read(length).decode("utf-8")
        else:
            entry = _strings(fh.read(length), {ENTRY_KEY, ENTRY_VALUE})
            entries[entry.get(ENTRY_KEY, "")] = entry.get(ENTRY_VALUE, "")
    if entries:
        numbers = {
            key: int(entries[key]) if key in entries else None for key in ("offset", "length")
        }
        found.append(ExternalTensor(name, entries.get("location", ""), **numbers))


def _sparse(fh: IO[bytes], end: int, found: list[ExternalTensor]) -> None:
    for _, length in _fields(fh, end, {SPARSE_VALUES, SPARSE_INDICES}):
        _tensor(fh, fh.tell() + length, found)


def _attribute(fh: IO[bytes], end: int, found: list[ExternalTensor]) -> None:
    wanted = {ATTRIBUTE_TENSOR, ATTRIBUTE_GRAPH, ATTRIBUTE_TENSORS, ATTRIBUTE_GRAPHS}
    wanted |= {ATTRIBUTE_SPARSE_TENSOR, ATTRIBUTE_SPARSE_TENSORS}
    for field, length in _fields(fh, end, wanted):
        stop = fh.tell() + length
        if field in (ATTRIBUTE_TENSOR, ATTRIBUTE_TENSORS):
            _tensor(fh, stop, found)
        elif field in (ATTRIBUTE_GRAPH, ATTRIBUTE_GRAPHS):
            _graph(fh, stop, found)
        else:
            _sparse(fh, stop, found)


def _graph(fh: IO[bytes], end: int, found: list[ExternalTensor]) -> None:
    """Append the external tensors of the GraphProto up to `end` and of its subgraphs."""
    wanted = {GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_SPARSE_INITIALIZER}
    for field, length in _fields(fh, end, wanted):
        stop = fh.tell() + length
        if field == GRAPH_INITIALIZER:
            _tensor(fh, stop, found)
        elif field == GRAPH_SPARSE_INITIALIZER:
            _sparse(fh, stop, found)
        else:
            for _, attribute_length in _fields(fh, stop, {NODE_ATTRIBUTE}):
                _attribute(fh, fh.tell() + attribute_length, found)


def read_onnx_external_data(path: str | Path) -> list[ExternalTensor]:
    """The tensors of an .onnx file (initializers, node attributes, subgraphs) whose bytes are
    external data, in file order; BundleError when it does not parse. A file without the bytes
    of the key "location", which every external data entry has, has none: it is searched for
    first (at memory speed), and only a file that has them is walked, field headers read and
    a graph's own weights skipped with seeks."""

    def walk(fh: IO[bytes], size: int) -> list[ExternalTensor]:
        found: list[ExternalTensor] = []
        if size == 0:
            return found
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
            if view.find(EXTERNAL_LOCATION_KEY) < 0:
                return found
        for _, graph_length in _fields(fh, size, {MODEL_GRAPH}):
            _graph(fh, fh.tell() + graph_length, found)
        return found

    return _read(path, walk)  # type: ignore[return-value]
