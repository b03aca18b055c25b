"""A graph's ONNX external data, as a bundle allows it: one data file per graph, named after
it, inside the bundle, listed in the manifest, and long enough for every tensor it holds.

    data_file_name("decoder.onnx")                          # "decoder.onnx.data"
    check_external_data(bundle_dir, graph_path, listed)     # "decoder.onnx.data", or None

The exporter writes a graph's weights beside it once they pass a threshold
(export/external_data.py; docs/bundle.md, "Files"). onnxruntime reads them from the location
each tensor names, relative to the graph's folder, when a session is opened from the graph's
path; `check_external_data` refuses, before any session, a location outside the bundle, another
graph's data file, one missing or unlisted (so not checksummed), and one shorter than the
tensors it should hold. Read from the protobuf (runtime/onnx_proto.py), without onnx.
"""

from __future__ import annotations

from pathlib import Path, PurePath

from .constants import MANIFEST_FILE
from .errors import BundleError
from .onnx_proto import ExternalTensor, read_onnx_external_data

DATA_SUFFIX = ".data"


def data_file_name(graph: str) -> str:
    """The name of graph file `graph`'s external data file: `graph` + ".data"."""
    return graph + DATA_SUFFIX


def _outside(location: str) -> bool:
    parts = PurePath(location.replace("\\", "/")).parts
    return not location or PurePath(location).is_absolute() or ".." in parts or ":" in location


def _check_location(graph: Path, tensor: ExternalTensor, own: str) -> None:
    if tensor.location == own:
        return
    if _outside(tensor.location):
        raise BundleError(
            f"{graph} reads tensor {tensor.name!r} from {tensor.location!r}, which is outside "
            "the bundle directory; a bundle only uses its own files: re-export it"
        )
    raise BundleError(
        f"{graph} reads tensor {tensor.name!r} from {tensor.location!r}, not from its own data "
        f"file {own} (data files swapped or renamed); re-export the bundle"
    )


def check_external_data(directory: str | Path, graph: str | Path, listed: set[str]) -> str | None:
    """The bundle name of the data file the .onnx graph `graph` reads its weights from (None
    when they are all inside it). BundleError when a tensor names another file than
    `data_file_name(graph)`, or that file is missing, not in `listed` (the manifest's files,
    whose checksums are checked elsewhere) or shorter than the tensors' offsets and lengths."""
    directory, graph = Path(directory), Path(graph)
    tensors = read_onnx_external_data(graph)
    if not tensors:
        return None
    own = data_file_name(graph.name)
    for tensor in tensors:
        _check_location(graph, tensor, own)
    data = graph.with_name(own)
    name = data.relative_to(directory).as_posix()
    if not data.is_file():
        raise BundleError(
            f"{data} is missing: {graph.name} keeps its weights there; copy the bundle whole "
            "or re-export it"
        )
    if name not in listed:
        raise BundleError(
            f"{data} is not listed in {MANIFEST_FILE}, so its checksum cannot be verified; "
            "re-export the bundle"
        )
    size = data.stat().st_size
    for tensor in tensors:
        end = (tensor.offset or 0) + (tensor.length or 0)
        if (tensor.offset or 0) < 0 or (tensor.length or 0) < 0 or end > size:
            raise BundleError(
                f"{data} has {size} bytes but {graph.name} reads tensor {tensor.name!r} up to "
                f"byte {end}: it is truncated; copy the bundle again or re-export it"
            )
    return name
