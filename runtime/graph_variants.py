"""The extra graphs an encoder–decoder bundle may hold besides `encoder.onnx` and
`decoder.onnx`: one descriptor per graph variant, and the one opener every variant goes
through.

    GRAPH_VARIANTS["inplace"].files["int8"]          # "decoder.inplace.int8.onnx"
    bundle.graph_variants                            # {"inplace": {"fp32": Path(...)}, ...}
    session = open_graph_variant(bundle, "steps", "fp32", providers, options)

| key | graph | used by |
| --- | --- | --- |
| search | one `com.microsoft.BeamSearch` graph around encoder and decoder | `search` auto / graph |
| steps | decoder with per-row positions and a key mask | `edgeseq serve` step batching |
| inplace | decoder writing its cache into preallocated buffers | CPU beam search on the loop |

A variant's manifest entry is an object with one object per precision it was exported in
(`{"fp32": {"file": "decoder.steps.onnx", ...}, "int8": {...}, ...}`) beside descriptive
fields. `load_bundle` checks every entry of every registered variant through
`read_graph_variants` (an object; each precision names a file inside the bundle, listed in
the manifest, so its checksum and vocabulary fingerprint are verified with the others) and
`open_graph_variant` checks a session's inputs and outputs against the descriptor's, so a new
variant gets the same checks by being registered here. The exporter's side of each variant
(its graph, parity group and report rows) is export/kinds/seq2seq/graph_variants.py; the
browser's table of keys and precisions (runtime/web/graph_variants_table.mjs) is written from
this registry by scripts/graph_variants_mjs.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import onnxruntime as ort

from . import constants as C
from .config import ModelConfig
from .errors import BundleError
from .manifest import check_inside
from .onnx_proto import read_onnx_io
from .providers import create_session


class HasGraphVariants(Protocol):
    """What the openers read of a loaded bundle (runtime/bundle.py's `Bundle`)."""

    graph_variants: dict[str, dict[str, Path]]
    config: ModelConfig


Names = Callable[[ModelConfig], tuple[str, ...]]


@dataclass(frozen=True)
class GraphVariant:
    """What the runtime knows of one extra graph: its manifest key, its file per precision,
    what it is (for messages) and the inputs and outputs its graph must have."""

    key: str  # the `--variants` name and manifest.json's key
    files: dict[str, str]  # precision -> file name the exporter writes
    title: str  # "the step-batching decoder"
    inputs: Names  # the documented input names (docs/bundle.md), for the model's config
    outputs: Names

    def export_hint(self, precision: str) -> str:
        """How to export the variant in `precision`."""
        extra = "" if precision == "fp32" else f",{precision}"
        return f"edgeseq export --variants fp32{extra},{self.key}"


def _search_inputs(_: ModelConfig) -> tuple[str, ...]:
    return C.SEARCH_INPUT_NAMES


def _search_outputs(_: ModelConfig) -> tuple[str, ...]:
    return (C.SEARCH_SEQUENCES, C.SEARCH_SCORES)


def _decoder_outputs(cfg: ModelConfig) -> tuple[str, ...]:
    return C.decoder_outputs(cfg.n_decoder_layers)


SEARCH = GraphVariant(
    "search", C.SEARCH_FILES, "the one-graph search", _search_inputs, _search_outputs
)
STEPS = GraphVariant(
    "steps",
    C.STEPS_FILES,
    "the step-batching decoder",
    lambda cfg: C.steps_decoder_inputs(cfg.n_decoder_layers),
    _decoder_outputs,
)
IN_PLACE = GraphVariant(
    "inplace",
    C.IN_PLACE_FILES,
    "the in-place cache decoder",
    lambda cfg: C.in_place_decoder_inputs(cfg.n_decoder_layers),
    _decoder_outputs,
)
GRAPH_VARIANTS: dict[str, GraphVariant] = {v.key: v for v in (SEARCH, STEPS, IN_PLACE)}


def read_graph_variants(
    path: Path, manifest: dict[str, Any], listed: set[str], cfg: ModelConfig
) -> dict[str, dict[str, Path]]:
    """{key: {precision: graph path}} of every registered variant `manifest` lists; BundleError
    for an entry that is not an object, a precision that names no file, a file outside the
    bundle, missing or not in the manifest's `files` (whose checksums `load_bundle` checks),
    or an .onnx graph without the documented inputs and outputs (read from its protobuf, so
    that a graph a process may never open is still checked when the bundle loads)."""
    where = path / C.MANIFEST_FILE
    found: dict[str, dict[str, Path]] = {}
    for key, variant in GRAPH_VARIANTS.items():
        entry = manifest.get(key)
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise BundleError(f'{where}: "{key}" is not a JSON object; re-export the bundle')
        files: dict[str, Path] = {}
        for precision in variant.files:
            if precision not in entry:
                continue
            item = entry[precision]
            name = item.get("file") if isinstance(item, dict) else None
            if not isinstance(name, str):
                raise BundleError(
                    f'{where}: "{key}" lists {precision} without naming its graph file; '
                    "re-export the bundle"
                )
            file = check_inside(path, name)
            if name not in listed:
                if not file.exists():
                    raise BundleError(f"{file} is missing from the bundle; re-export it")
                raise BundleError(
                    f"{file} is not listed in {C.MANIFEST_FILE}, so its checksum cannot be "
                    "verified; re-export the bundle"
                )
            if file.suffix == ".onnx":
                check_io(variant, file, read_onnx_io(file), cfg)
            files[precision] = file
        found[key] = files
    return found


def graph_variant_path(bundle: HasGraphVariants, key: str, precision: str) -> Path | None:
    """The file of variant `key` in `precision`, or None when the bundle has none."""
    return bundle.graph_variants.get(key, {}).get(precision)


def open_graph_variant(
    bundle: HasGraphVariants,
    key: str,
    precision: str,
    providers: list[Any],
    options: ort.SessionOptions | None = None,
) -> ort.InferenceSession | None:
    """A session of variant `key`'s graph in `precision` on `providers` (None when the bundle
    has none); BundleError when onnxruntime cannot load it or its inputs and outputs are not
    the documented ones for config.json's model."""
    path = graph_variant_path(bundle, key, precision)
    if path is None:
        return None
    session = create_session(path, providers, options or ort.SessionOptions())
    names = (
        tuple(a.name for a in session.get_inputs()),
        tuple(a.name for a in session.get_outputs()),
    )
    check_io(GRAPH_VARIANTS[key], path, names, bundle.config)
    return session


def check_io(
    variant: GraphVariant,
    path: Path,
    names: tuple[tuple[str, ...], tuple[str, ...]],
    cfg: ModelConfig,
) -> None:
    """BundleError unless `names` (inputs, outputs) are `variant`'s for `cfg` (a decoder's
    may add the search's outputs, `C.TOP_OUTPUTS`: the in-place decoder has them since they
    exist, a graph exported before them has none)."""
    got = set(names[0]), set(names[1])
    optional = C.optional_outputs(got[1]) if variant.key != SEARCH.key else ()
    want = set(variant.inputs(cfg)), set(variant.outputs(cfg)) | set(optional)
    if got != want:
        missing = sorted((want[0] - got[0]) | (want[1] - got[1]))
        extra = sorted((got[0] - want[0]) | (got[1] - want[1]))
        raise BundleError(
            f"{path} does not have {variant.title}'s inputs and outputs for config.json's "
            f"{cfg.n_decoder_layers} decoder layers (missing {missing[:4]}, unexpected "
            f"{extra[:4]}); re-export the bundle"
        )
