"""Bundle loading refuses incomplete, tampered, too-new and mismatched bundles (issue 4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import check_onnxruntime, load_bundle, version_key
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.manifest import write_manifest
from edgeseq.runtime.tokenizer import TARGET_TOKENIZER_FILE


@pytest.fixture
def bundle_copy(runtime_case, tmp_path: Path) -> Path:
    """A private copy of the runtime bundle, free to break."""
    return Path(shutil.copytree(runtime_case.bundle, tmp_path / "bundle"))


def edit_manifest(bundle: Path, **changes) -> None:
    path = bundle / C.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def rehash(bundle: Path) -> None:
    """Rewrite the manifest's files table as if the bundle had been exported this way."""
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text())
    write_manifest(bundle, {k: v for k, v in manifest.items() if k != "files"})


def test_a_good_bundle_loads(runtime_case) -> None:
    bundle = load_bundle(runtime_case.bundle)
    assert bundle.config == runtime_case.model.cfg
    assert bundle.graphs("fp32") == (
        runtime_case.bundle / C.ENCODER_FILE,
        runtime_case.bundle / C.DECODER_FILE,
    )
    assert not bundle.tokenizers.shared  # separate target vocabulary: tokenizer.target.json
    assert bundle.tokenizers.target.encode("CBA") == runtime_case.tokenizers.target.encode("CBA")
    assert bundle.task == {"name": "reverse", "options": {}}


def test_a_tampered_graph_is_refused(bundle_copy: Path) -> None:
    data = bytearray((bundle_copy / C.DECODER_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle_copy / C.DECODER_FILE).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"decoder\.onnx does not match its sha256.*tampered"):
        load_bundle(bundle_copy)


def test_a_tampered_tokenizer_is_refused(bundle_copy: Path) -> None:
    path = bundle_copy / TARGET_TOKENIZER_FILE
    path.write_text(path.read_text().replace('"A"', '"Z"'))
    with pytest.raises(BundleError, match=r"tokenizer\.target\.json does not match its sha256"):
        load_bundle(bundle_copy)


@pytest.mark.parametrize("name", [C.ENCODER_FILE, TARGET_TOKENIZER_FILE, C.CONFIG_FILE])
def test_a_missing_file_is_refused(bundle_copy: Path, name: str) -> None:
    (bundle_copy / name).unlink()
    with pytest.raises(
        BundleError, match=rf"{name.replace('.', '[.]')} is missing from the bundle"
    ):
        load_bundle(bundle_copy)


def test_missing_manifest_and_directory_are_refused(bundle_copy: Path, tmp_path: Path) -> None:
    (bundle_copy / C.MANIFEST_FILE).unlink()
    with pytest.raises(BundleError, match=r"manifest\.json is missing.*not an edgeseq bundle"):
        load_bundle(bundle_copy)
    with pytest.raises(BundleError, match=r"nowhere is neither a bundle directory nor a built-in"):
        load_bundle(tmp_path / "nowhere")


def test_an_unlisted_file_is_refused(bundle_copy: Path) -> None:
    manifest = json.loads((bundle_copy / C.MANIFEST_FILE).read_text())
    del manifest["files"][C.CONFIG_FILE]
    (bundle_copy / C.MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"config\.json is not listed in manifest\.json"):
        load_bundle(bundle_copy)


def test_a_newer_format_is_refused(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, format_version=C.BUNDLE_FORMAT_VERSION + 1)
    with pytest.raises(BundleError, match="format version 3, this edgeseq reads up to 2: upgrade"):
        load_bundle(bundle_copy)


def test_a_format_1_bundle_is_refused_with_the_re_export_command(bundle_copy: Path) -> None:
    """Format 1 graphs took the K/V of all layers stacked in one tensor: no longer read."""
    edit_manifest(bundle_copy, format_version=1)
    with pytest.raises(
        BundleError, match=r"format version 1, .*stacked.*edgeseq export CHECKPOINT"
    ):
        load_bundle(bundle_copy)


def test_a_bundle_needing_a_newer_onnxruntime_is_refused(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, min_onnxruntime="99.1.0")
    with pytest.raises(BundleError, match=r"needs onnxruntime >= 99\.1\.0 but .* is installed"):
        load_bundle(bundle_copy)


def test_onnxruntime_versions_compare_numerically(tmp_path: Path) -> None:
    assert version_key("1.31.1+cu13") == (1, 31, 1)
    assert version_key("1.20.0rc1") == (1, 20, 0)
    assert version_key("1.9.0") < version_key("1.17.0")
    check_onnxruntime({"min_onnxruntime": "1.17.0"}, tmp_path, installed="1.31.1")
    with pytest.raises(BundleError, match=r"needs onnxruntime >= 1\.17\.0 but 1\.9\.2 is"):
        check_onnxruntime({"min_onnxruntime": "1.17.0"}, tmp_path, installed="1.9.2")


def test_a_fused_bundle_on_an_older_onnxruntime_names_no_fuse(tmp_path: Path) -> None:
    """onnxruntime 1.18-1.20 (what pyproject.toml accepts) cannot run fused attention: the
    refusal says how to export a bundle they run; other refusals do not suggest it."""
    fused = {"min_onnxruntime": "1.21.0", "fused_attention": True}
    with pytest.raises(BundleError, match=r"needs onnxruntime >= 1\.21\.0 .*--no-fuse"):
        check_onnxruntime(fused, tmp_path, installed="1.19.2")
    search = {"min_onnxruntime": "1.22.0", "fused_attention": True}  # the search variant
    unfused = {**fused, "fused_attention": False}
    for manifest, installed in ((search, "1.21.1"), (unfused, "1.19.2")):
        with pytest.raises(BundleError, match="upgrade it") as refused:
            check_onnxruntime(manifest, tmp_path, installed=installed)
        assert "--no-fuse" not in str(refused.value)
    check_onnxruntime(fused, tmp_path, installed="1.21.0")


def test_an_unknown_variant_is_refused(runtime_case) -> None:
    with pytest.raises(BundleError, match="has no variant 'int8'; it has fp32"):
        Generator.load(runtime_case.bundle, providers="cpu", variant="int8")


def test_config_that_disagrees_with_the_graphs_is_refused(bundle_copy: Path) -> None:
    config = json.loads((bundle_copy / C.CONFIG_FILE).read_text())
    config["model"]["n_heads"] = 2  # d_model 32 stays divisible: a valid config, wrong graphs
    (bundle_copy / C.CONFIG_FILE).write_text(json.dumps(config))
    rehash(bundle_copy)
    load_bundle(bundle_copy)  # checksums and config are fine on their own
    root_cause = r"do not belong together: config\.json says n_heads 2 but the graphs say 4 "
    with pytest.raises(BundleError, match=root_cause):
        Generator.load(bundle_copy, providers="cpu", threads=1)


def test_a_decoder_from_another_model_is_refused(
    bundle_copy: Path, runtime_model, one_torch_thread
) -> None:
    from dataclasses import replace

    from edgeseq.build_model.model import Seq2SeqTransformer
    from edgeseq.export.kinds.seq2seq.graphs import export_decoder

    other_cfg = replace(runtime_model.model.cfg, n_decoder_layers=1)
    export_decoder(Seq2SeqTransformer(other_cfg).eval(), bundle_copy / C.DECODER_FILE)
    rehash(bundle_copy)
    layers = runtime_model.model.cfg.n_decoder_layers
    with pytest.raises(
        BundleError,
        match=rf"decoder\.onnx does not match config\.json's {layers} decoder layers "
        r"\(missing .*past_k\.1",
    ):
        Generator.load(bundle_copy, providers="cpu", threads=1)
