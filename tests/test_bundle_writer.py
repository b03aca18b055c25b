"""The bundle on disk: config/manifest schema, checksums, atomic writes, `edgeseq inspect`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli
from edgeseq.export.bundle import OutputExistsError
from edgeseq.export.kinds.seq2seq import bundle as bundle_module
from edgeseq.export.kinds.seq2seq.bundle import export_bundle
from edgeseq.export.onnx_export import GraphInfo
from edgeseq.runtime import constants as C
from edgeseq.runtime.errors import BundleError, ParityError
from edgeseq.runtime.manifest import check_files, read_manifest
from edgeseq.runtime.tokenizer import TARGET_TOKENIZER_FILE, TOKENIZER_CONFIG_FILE


def test_config_and_manifest_schema(export_case) -> None:
    text = (export_case.bundle / C.CONFIG_FILE).read_text()
    config = json.loads(text)
    assert text == json.dumps(config, indent=2, sort_keys=True) + "\n"
    assert set(config) == {"model", "special_tokens", "io", "tokenizers", "task"}
    assert config["model"] == export_case.model.cfg.to_dict()
    assert config["special_tokens"]["eos"] == {"id": 2, "token": C.EOS}
    layers = export_case.model.cfg.n_decoder_layers
    assert [v["name"] for v in config["io"]["decoder"]["inputs"]] == list(C.decoder_inputs(layers))
    assert config["tokenizers"] == {"source": C.TOKENIZER_FILE, "target": TARGET_TOKENIZER_FILE}
    manifest = read_manifest(export_case.bundle)
    assert manifest == export_case.manifest
    assert manifest["format_version"] == C.BUNDLE_FORMAT_VERSION
    assert manifest["opset"] >= 18 and manifest["ir_version"] >= 8
    assert set(manifest["exporter"]) == {"torch", "onnx", "onnxscript", "onnxruntime"}
    assert set(manifest["variants"]) == {"fp32"}  # the default; more in test_variants.py
    fp32 = manifest["variants"]["fp32"]
    assert {k: fp32[k] for k in ("encoder", "decoder", "verified", "format", "precision")} == {
        "encoder": C.ENCODER_FILE, "decoder": C.DECODER_FILE, "verified": True,
        "format": "onnx", "precision": "fp32",
    }  # fmt: skip
    graph_bytes = [manifest["files"][name]["bytes"] for name in (C.ENCODER_FILE, C.DECODER_FILE)]
    assert fp32["bytes"] == sum(graph_bytes) and fp32["size_ratio"] == 1.0
    assert fp32["gate"] is None and fp32["speed"]["tokens_per_second"] > 0
    assert set(manifest["files"]) == {
        C.ENCODER_FILE, C.DECODER_FILE, C.CONFIG_FILE, C.TOKENIZER_FILE, TARGET_TOKENIZER_FILE,
        TOKENIZER_CONFIG_FILE,
    }  # fmt: skip
    check_files(export_case.bundle, manifest)


def test_tampered_file_is_detected(export_case, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(export_case.bundle, copy)
    data = bytearray((copy / C.DECODER_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    (copy / C.DECODER_FILE).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"decoder\.onnx does not match its sha256"):
        check_files(copy, read_manifest(copy))
    result = CliRunner().invoke(cli, ["inspect", str(copy)])
    assert result.exit_code != 0 and "TAMPERED" in result.output
    assert isinstance(result.exception, BundleError)


def test_inspect_prints_graphs_files_and_parity(export_case) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(export_case.bundle)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert re.search(r"in\s+src_ids\s+int64\s+\[batch, src_len\]", out)
    last = export_case.model.cfg.n_decoder_layers - 1
    name = re.escape(f"present_k.{{0..{last}}}" if last else "present_k.0")
    assert re.search(rf"out\s+{name}\s+float32\s+\[batch, .*past_len \+ new_len", out)
    assert "present_k.1 " not in out  # per-layer tensors fold into one row
    for text in (
        f"opset {export_case.manifest['opset']}",
        "encoder.onnx",
        f"{export_case.manifest['files']['decoder.onnx']['bytes']:,}",
        "200/200",
        "parity passed",
    ):
        assert text in out, text


def test_inspect_imports_neither_torch_nor_onnx() -> None:
    code = (
        "import sys, edgeseq.cli.inspect; "
        "print(sorted(m for m in ('torch', 'onnx', 'onnxscript') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


# -- atomic writes, with the expensive steps replaced by fakes --------------------------------
def _fake_graph(model, path, opset=None, fuse=True, metadata=None) -> GraphInfo:
    Path(path).write_bytes(b"not really onnx")
    return GraphInfo(Path(path), 15, 0.0, 20, 10)


def _fail(*args, **kwargs):
    raise AssertionError("must not be called")


def test_existing_output_is_refused_without_force(tmp_path, monkeypatch, export_model_factory):
    model, tokenizers = export_model_factory("post-sin-relu")
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    monkeypatch.setattr(bundle_module, "export_encoder", _fail)
    with pytest.raises(OutputExistsError, match="already exists; pass --force"):
        export_bundle(model, tokenizers, out)
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]
    assert (out / "keep.txt").read_text() == "old"


def test_force_replaces_an_existing_bundle(tmp_path, monkeypatch, export_model_factory):
    model, tokenizers = export_model_factory("post-sin-relu")
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    monkeypatch.setattr(bundle_module, "export_encoder", _fake_graph)
    monkeypatch.setattr(bundle_module, "export_decoder", _fake_graph)
    manifest = export_bundle(model, tokenizers, out, force=True, verify=False)
    assert manifest["variants"]["fp32"]["verified"] is False
    assert manifest["parity"] == {"skipped": True}
    assert not (out / "keep.txt").exists() and (out / C.MANIFEST_FILE).is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]  # no .tmp / .old left


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()], ids=type)
def test_interrupted_export_leaves_nothing(tmp_path, monkeypatch, export_model_factory, error):
    model, tokenizers = export_model_factory("post-sin-relu")

    def decoder_dies(model, path, opset=None, fuse=True, metadata=None):
        Path(path).write_bytes(b"half a graph")
        raise error

    monkeypatch.setattr(bundle_module, "export_encoder", _fake_graph)
    monkeypatch.setattr(bundle_module, "export_decoder", decoder_dies)
    with pytest.raises(type(error)):
        export_bundle(model, tokenizers, tmp_path / "bundle")
    assert list(tmp_path.iterdir()) == []


def test_failed_parity_writes_nothing(tmp_path, monkeypatch, export_model_factory) -> None:
    model, tokenizers = export_model_factory("post-sin-relu")
    failing = {
        "passed": False,
        "tolerance": 1e-4,
        "level1": {"passed": False, "max_abs_diff": {"logits": 0.5}},
        "level2": {"passed": True},
        "level3": {"passed": True},
    }
    monkeypatch.setattr(bundle_module, "export_encoder", _fake_graph)
    monkeypatch.setattr(bundle_module, "export_decoder", _fake_graph)
    monkeypatch.setattr(bundle_module, "open_engine", lambda *args: None)
    monkeypatch.setattr(bundle_module, "run_parity", lambda *args, **kwargs: failing)
    with pytest.raises(ParityError, match=r"logits.*5\.00e-01") as info:
        export_bundle(model, tokenizers, tmp_path / "bundle")
    assert info.value.report is failing
    assert list(tmp_path.iterdir()) == []
