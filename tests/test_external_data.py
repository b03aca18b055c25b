"""Graphs with external data (issue 55 item 1): a graph whose weights pass the threshold keeps
them in `<graph>.onnx.data`, listed and checksummed like every file; the runtime loads them,
refuses a data file outside the bundle, missing, unlisted, truncated or another graph's; a
bundle under the threshold is what it was. The threshold is lowered to 0 MiB
(EDGESEQ_EXTERNAL_DATA_MB) so that the tiny runtime model writes external data."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import export_runtime_variants
from google.protobuf.message import EncodeError
from onnx.external_data_helper import uses_external_data
from test_hostile_files import run_main

from edgeseq.export import external_data
from edgeseq.export.external_data import (
    EXTERNAL_DATA_BYTES,
    EXTERNAL_DATA_ENV,
    SMALL_TENSOR_BYTES,
    GraphSizeError,
    external_data_threshold,
    external_location,
    graph_bytes,
    refuse_unsupported_variants,
    save_graph,
    stream_weights,
)
from edgeseq.export.onnx_export import ExportError, export_module
from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.options import GenerationOptions

SOURCES = ["abc", "hgfedcba", "j", "abcdefghij", "ca"]
HELPER = Path(__file__).parent / "edge" / "load_bundle.mjs"
NODE = shutil.which("node")


@contextmanager
def threshold_mb(value: str) -> Iterator[None]:
    """EDGESEQ_EXTERNAL_DATA_MB set to `value` inside the block."""
    before = os.environ.get(EXTERNAL_DATA_ENV)
    os.environ[EXTERNAL_DATA_ENV] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[EXTERNAL_DATA_ENV]
        else:
            os.environ[EXTERNAL_DATA_ENV] = before


@pytest.fixture(scope="module")
def external_bundle(runtime_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runtime_model exported with every graph's weights in a data file: fp32, int8 and the
    search graph, with parity and the int8 gate (export_runtime_variants)."""
    bundle = tmp_path_factory.mktemp("external") / "reverse-external"
    with threshold_mb("0"):
        return export_runtime_variants(runtime_model, bundle, ("fp32", "int8", "search"))


def graphs_of(bundle: Path) -> list[Path]:
    return sorted(bundle.glob("*.onnx"))


def rehash(bundle: Path) -> None:
    """Rewrite the manifest's files table for the bundle as it is now (a forger's move)."""
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text())
    files = {}
    for path in sorted(p for p in bundle.iterdir() if p.name != C.MANIFEST_FILE):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        files[path.name] = {"sha256": digest, "bytes": path.stat().st_size}
    manifest["files"] = files
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def set_location(graph: Path, location: str) -> None:
    """Point every external tensor of `graph` at `location` (the data stays where it is)."""
    model = onnx.load(str(graph), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(model, str(graph), save_as_external_data=False)


def ids(bundle: Path, variant: str = "fp32", search: str = "loop", **options) -> list:
    generator = Generator.load(bundle, "cpu", threads=1, variant=variant, search=search)
    return [r.token_ids for r in generator.generate(SOURCES, GenerationOptions(**options))]


# -- the threshold --------------------------------------------------------------------------
def test_threshold_is_64_mib_unless_the_variable_sets_it(monkeypatch) -> None:
    monkeypatch.delenv(EXTERNAL_DATA_ENV, raising=False)
    assert external_data_threshold() == EXTERNAL_DATA_BYTES == 64 << 20
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0.5")
    assert external_data_threshold() == 1 << 19
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "lots")
    with pytest.raises(GraphSizeError, match=f"{EXTERNAL_DATA_ENV} is 'lots': set it to a"):
        external_data_threshold()


def test_a_bad_threshold_is_refused_before_the_export(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "-1")
    args = ["export", str(tmp_path / "no-checkpoint"), "--out", str(tmp_path / "b")]
    code, _, err = run_main(args, capsys)
    assert (code, err) == (1, f"error: {EXTERNAL_DATA_ENV} is '-1': set it to a number of MiB "
                               "(e.g. 1024) or unset it\n")  # fmt: skip


# -- a small model's bundle is what it was ----------------------------------------------------
def test_small_bundle_has_no_data_file_and_the_same_graph_bytes(
    runtime_case, external_bundle: Path, tmp_path: Path
) -> None:
    """runtime_case was exported under the default threshold: one file per graph, and its
    bytes are those the single-file save writes of the external bundle's graphs read back."""
    assert EXTERNAL_DATA_ENV not in os.environ
    assert not list(runtime_case.bundle.glob("*.data"))
    listed = json.loads((runtime_case.bundle / C.MANIFEST_FILE).read_text())["files"]
    assert not [name for name in listed if name.endswith(".data")]
    for name in (C.ENCODER_FILE, C.DECODER_FILE):
        assert (external_bundle / f"{name}.data").is_file()
        model = onnx.load(str(external_bundle / name))  # weights read back from the data file
        for tensor in model.graph.initializer:
            tensor.ClearField("data_location")  # set to DEFAULT by the load; never written
        inline = tmp_path / name
        onnx.save_model(model, str(inline), save_as_external_data=False)
        small = (runtime_case.bundle / name).read_bytes()
        assert hashlib.sha256(inline.read_bytes()).digest() == hashlib.sha256(small).digest()


# -- the external bundle: listed, loaded, the same outputs --------------------------------------
def test_every_graph_has_its_data_file_listed_with_its_checksum(external_bundle: Path) -> None:
    manifest = json.loads((external_bundle / C.MANIFEST_FILE).read_text())
    graphs = graphs_of(external_bundle)
    assert {g.name for g in graphs} == {
        "encoder.onnx", "decoder.onnx", "encoder.int8.onnx", "decoder.int8.onnx",
        "search.onnx", "search.int8.onnx",
    }  # fmt: skip
    for graph in graphs:
        data = graph.with_name(graph.name + ".data")
        entry = manifest["files"][data.name]
        assert entry["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
        assert entry["bytes"] == data.stat().st_size > graph.stat().st_size / 4
        assert data.stat().st_mode & 0o777 == graph.stat().st_mode & 0o777  # not onnx's 0600
    fp32 = manifest["variants"]["fp32"]
    assert fp32["bytes"] == sum(
        (external_bundle / n).stat().st_size for n in manifest["files"] if "int8" not in n
        and n.startswith(("encoder.onnx", "decoder.onnx"))
    )  # fmt: skip


def test_only_tensors_under_1_kib_stay_inside_a_graph(external_bundle: Path) -> None:
    """docs/bundle-large.md: with a data file, tensors under SMALL_TENSOR_BYTES stay in the
    graph and every other one is in its data file (the streamed export path included)."""
    for graph in graphs_of(external_bundle):
        model = onnx.load(str(graph), load_external_data=False)
        inside = [t.name for t in model.graph.initializer if not uses_external_data(t)]
        big = [
            name for name, t in ((t.name, t) for t in model.graph.initializer)
            if name in inside and len(t.raw_data) >= SMALL_TENSOR_BYTES
        ]  # fmt: skip
        assert big == [], graph.name
        outside = [t for t in model.graph.initializer if uses_external_data(t)]
        assert outside and all(external_location(t) == graph.name + ".data" for t in outside)


def test_a_tensor_an_edit_adds_to_a_streamed_graph_goes_to_its_data_file(tmp_path: Path) -> None:
    """save_graph of a graph whose weights stream_weights wrote: a large tensor added since
    (as a graph edit adds one) is appended to the same data file, a small one stays inside."""
    import numpy as np
    import onnx_ir as ir

    weight = ir.Value(name="w", const_value=ir.tensor(np.arange(1024, dtype=np.float32)))
    x = ir.Value(name="x", shape=ir.Shape([1024]), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.node("Add", [x, weight], outputs=[ir.Value(name="y")])
    node.outputs[0].shape, node.outputs[0].type = x.shape, x.type
    graph = ir.Graph(
        [x], node.outputs, nodes=[node], initializers=[weight], opset_imports={"": 18}, name="g"
    )
    path = tmp_path / "decoder.onnx"
    proto = stream_weights(ir.Model(graph, ir_version=10), path)
    added = np.full(512, 2.0, np.float32)  # 2 KiB, and a 4-byte one
    proto.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(added, "big"),
            onnx.numpy_helper.from_array(np.float32([3]), "small"),
        ]
    )
    save_graph(proto, path, check="basic")
    saved = onnx.load(str(path), load_external_data=False)
    where = {t.name: external_location(t) for t in saved.graph.initializer}
    assert where == {"w": "decoder.onnx.data", "big": "decoder.onnx.data", "small": None}
    loaded = onnx.load(str(path))
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in loaded.graph.initializer}
    assert np.array_equal(arrays["w"], np.arange(1024)) and np.array_equal(arrays["big"], added)


def test_generates_the_ids_of_the_single_file_bundle(runtime_case, external_bundle: Path) -> None:
    for options in ({}, {"beam_size": 3}):
        assert ids(external_bundle, **options) == ids(runtime_case.bundle, **options)
    assert ids(external_bundle, search="graph") == ids(runtime_case.bundle)
    assert all(ids(external_bundle, "int8"))  # the gated int8 graphs run from their data files


def test_verify_and_inspect_pass(runtime_model, external_bundle: Path, tmp_path: Path) -> None:
    from edgeseq.build_model.checkpoint import save_checkpoint
    from edgeseq.cli.inspect import check_bundle, inspect_bundle
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import verify_bundle

    checkpoint = save_checkpoint(
        tmp_path / "ckpt", runtime_model.model, runtime_model.tokenizers,
        {"name": "reverse", "options": {}}, {},
    )  # fmt: skip
    report = verify_bundle(external_bundle, checkpoint, ExportOptions(inputs=8))
    assert report["passed"] is True
    text, bad = inspect_bundle(external_bundle)
    assert bad == [] and "  encoder.onnx (weights in encoder.onnx.data)" in text
    assert "decoder.int8.onnx.data" in text
    check_bundle(external_bundle)  # what `edgeseq inspect` runs: loads and opens every graph


def test_documented_loading_with_onnxruntime_alone(external_bundle: Path) -> None:
    """docs/bundle.md: a session opened from the graph's path reads its data file."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(external_bundle / "encoder.onnx"))
    src = np.array([[5, 6, 7, C.SPECIAL_TOKENS.index("</s>")]], dtype=np.int64)
    (memory,) = session.run(["memory"], {"src_ids": src})
    assert memory.shape[:2] == (1, 4) and np.isfinite(memory).all()


# -- hostile bundles --------------------------------------------------------------------------
@pytest.fixture
def copy(external_bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(external_bundle, tmp_path / "bundle"))


def refused(bundle: Path, capsys, match: str) -> None:
    """load_bundle and `edgeseq inspect` refuse `bundle` with one line matching `match`."""
    with pytest.raises(BundleError, match=match):
        load_bundle(bundle)
    code, _, err = run_main(["inspect", str(bundle)], capsys)
    assert code == 1 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("error: ")


@pytest.mark.parametrize("location", ["../encoder.onnx.data", "/tmp/encoder.onnx.data"])
def test_data_file_outside_the_bundle(copy: Path, capsys, location: str) -> None:
    set_location(copy / "encoder.onnx", location)
    rehash(copy)
    refused(copy, capsys, f"encoder.onnx reads tensor .* from '{location}', which is outside")


def test_data_file_linked_from_outside_the_bundle(copy: Path, tmp_path: Path, capsys) -> None:
    outside = tmp_path / "elsewhere.data"
    (copy / "encoder.onnx.data").rename(outside)
    (copy / "encoder.onnx.data").symlink_to(outside)
    rehash(copy)
    refused(copy, capsys, "names 'encoder.onnx.data', which is outside the bundle directory")


def test_another_graphs_data_file(copy: Path, capsys) -> None:
    set_location(copy / "encoder.onnx", "decoder.onnx.data")
    rehash(copy)
    refused(copy, capsys, r"not from its own data file encoder\.onnx\.data \(data files swapped")


def test_data_file_swapped_for_another_graphs(copy: Path, capsys) -> None:
    shutil.copy(copy / "decoder.onnx.data", copy / "encoder.onnx.data")
    refused(copy, capsys, "encoder.onnx.data does not match its sha256 in the manifest")


def test_missing_data_file(copy: Path, capsys) -> None:
    (copy / "decoder.onnx.data").unlink()
    refused(copy, capsys, "decoder.onnx.data is missing from the bundle")
    rehash(copy)  # no longer listed either
    refused(copy, capsys, "decoder.onnx.data is missing: decoder.onnx keeps its weights there")


def test_unlisted_data_file(copy: Path, capsys) -> None:
    rehash(copy)
    manifest = json.loads((copy / C.MANIFEST_FILE).read_text())
    del manifest["files"]["search.int8.onnx.data"]
    (copy / C.MANIFEST_FILE).write_text(json.dumps(manifest))
    refused(copy, capsys, "search.int8.onnx.data is not listed in manifest.json")


def test_truncated_data_file(copy: Path, capsys) -> None:
    data = copy / "decoder.onnx.data"
    data.write_bytes(data.read_bytes()[:-100])
    refused(copy, capsys, "decoder.onnx.data does not match its sha256")
    rehash(copy)
    refused(copy, capsys, r"decoder.onnx.data has \d+ bytes but decoder.onnx reads .* truncated")


@pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
def test_browser_hands_each_graph_its_data_file(external_bundle: Path) -> None:
    """The web runtime fetches and checks each graph's data file and gives it to
    onnxruntime-web as `externalData` under the name the graph reads it by."""
    out = subprocess.run(
        [NODE, str(HELPER), str(external_bundle), "both"], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    names = ("encoder.onnx.data", "decoder.onnx.data", "search.onnx.data")
    sizes = {name: (external_bundle / name).stat().st_size for name in names}
    assert json.loads(out) == {"ok": True, "externalData": sizes}


@pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
def test_browser_refuses_a_tampered_data_file(copy: Path) -> None:
    data = copy / "decoder.onnx.data"
    data.write_bytes(data.read_bytes()[:-100])
    out = subprocess.run([NODE, str(HELPER), str(copy)], capture_output=True, text=True).stdout
    assert json.loads(out) == {
        "error": "BundleError: decoder.onnx.data does not match its sha256 in manifest.json; "
        "re-export"
    }


# -- what the exporter cannot write ends in one line ------------------------------------------
def test_ort_format_of_graphs_with_external_data(runtime_model, tmp_path: Path) -> None:
    """The ORT converter reads the data file beside each graph; the .ort file holds it all."""
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle
    from edgeseq.export.variants import VariantOptions

    with threshold_mb("0"):
        export_bundle(
            runtime_model.model, runtime_model.tokenizers, tmp_path / "b", verify=False,
            variants=VariantOptions(("fp32", "ort")),
        )  # fmt: skip
    bundle = tmp_path / "b"
    assert (bundle / "decoder.onnx.data").is_file() and not list(bundle.glob("*.ort.data"))
    assert ids(bundle, "ort") == ids(bundle, "fp32")


def test_ort_format_of_graphs_over_2_gib_refused(runtime_case, monkeypatch) -> None:
    """An ORT file is one flatbuffer: a graph of 2 GiB or more has no ORT form, nor does the
    search graph of graphs whose sum reaches it."""
    graphs = [runtime_case.bundle / C.ENCODER_FILE, runtime_case.bundle / C.DECODER_FILE]
    refuse_unsupported_variants(graphs, ("fp32", "ort", "search"))  # small: every form
    together = sum(graph_bytes(g) for g in graphs)
    monkeypatch.setattr(external_data, "PROTOBUF_LIMIT", together)
    refuse_unsupported_variants(graphs, ("fp32", "ort"))  # no search graph: each is under it
    with pytest.raises(GraphSizeError, match=r"^the search graph of encoder\.onnx, decoder\.onnx"):
        refuse_unsupported_variants(graphs, ("fp32", "ort", "search"))
    monkeypatch.setattr(external_data, "PROTOBUF_LIMIT", graph_bytes(graphs[1]))
    with pytest.raises(GraphSizeError, match=r"^decoder\.onnx hold 2 GiB or more, .* leave ort"):
        refuse_unsupported_variants(graphs, ("fp32", "ort"))


def test_fp16_refused_for_a_graph_over_2_gib(monkeypatch, external_bundle: Path) -> None:
    """onnxruntime's fp16 converter infers shapes on the whole in-memory graph: protobuf fails
    at 2 GiB (measured on a 2.3 GB graph: EncodeError), so such a graph has no fp16 variant."""
    graphs = [external_bundle / "encoder.onnx", external_bundle / "decoder.onnx"]
    refuse_unsupported_variants(graphs, ("fp32", "fp16"))  # small graphs: fp16 is built
    monkeypatch.setattr(external_data, "PROTOBUF_LIMIT", graph_bytes(graphs[1]))
    with pytest.raises(GraphSizeError, match=r"decoder\.onnx hold 2 GiB or more, .* leave fp16"):
        refuse_unsupported_variants(graphs, ("fp32", "fp16"))


def test_protobuf_limit_becomes_an_error_that_names_the_fix(monkeypatch, tmp_path) -> None:
    """onnx's checker serialises the model: over 2 GiB protobuf raises EncodeError."""

    def too_large(*args, **kwargs):
        raise EncodeError("Failed to serialize proto")

    monkeypatch.setenv(EXTERNAL_DATA_ENV, "4096")
    monkeypatch.setattr(external_data.onnx.checker, "check_model", too_large)
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    with pytest.raises(GraphSizeError, match="set EDGESEQ_EXTERNAL_DATA_MB below 2048 or unset"):
        save_graph(model, tmp_path / "decoder.onnx", check="full")


class DataDependent(torch.nn.Module):
    """Control flow on a tensor's value: torch.export cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1


def test_exporter_failure_is_an_export_error(runtime_case, tmp_path: Path) -> None:
    cfg = runtime_case.model.cfg
    with pytest.raises(ExportError, match=r"torch\.onnx\.export cannot export the encoder graph"):
        export_module(
            DataDependent(), (torch.ones(2, 3),), {"x": None}, (("x",), ("y",)), cfg, "encoder",
            tmp_path / "encoder.onnx", None,
        )  # fmt: skip


def test_out_of_memory_during_export_is_one_line(monkeypatch, tmp_path: Path, capsys) -> None:
    from edgeseq.export import pipeline

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(pipeline, "export_checkpoint", no_memory)
    code, _, err = run_main(
        ["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "b")], capsys
    )
    assert code == 1 and err.splitlines()[-1].startswith("error: this machine ran out of memory")
    assert "Traceback" not in err
