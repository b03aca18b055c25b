"""Read what the runtime checks before opening a graph straight from an .onnx file's
protobuf, without onnx or a session: its `metadata_props` and its inputs' and outputs' names.

    read_onnx_metadata("b/decoder.onnx")   # {"edgeseq.source_vocab_sha256": "…", ...}
    read_onnx_io("b/decoder.steps.onnx")   # (("input_ids", ...), ("logits", ...))

Fields are walked with seeks over the ones not needed (initializers are most of a file), so
a check reads kilobytes of a graph of any size. Field numbers are onnx.proto's.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .errors import BundleError

# ModelProto: graph, metadata_props; GraphProto: input, output; ValueInfoProto: name;
# StringStringEntryProto: key, value.
MODEL_GRAPH, MODEL_METADATA_PROPS = 7, 14
GRAPH_INPUT, GRAPH_OUTPUT = 11, 12
VALUE_INFO_NAME = 1
ENTRY_KEY, ENTRY_VALUE = 1, 2


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
    except (OSError, ValueError, UnicodeDecodeError) as exc:
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
