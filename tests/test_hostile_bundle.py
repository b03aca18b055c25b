"""Hostile bundles (issue 24, classes 2 and 3): a bundle must be coherent, not only
unmodified, and `edgeseq inspect` runs the checks of load without ever showing a traceback.
Every case re-hashes the manifest, so the checksums alone would pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli
from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.manifest import read_manifest, sha256_file
from edgeseq.runtime.tokenizer import TARGET_TOKENIZER_FILE, Tokenizer


def rehash(bundle: Path) -> None:
    """Update every checksum in the manifest to the files as they are now."""
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text())
    for name, entry in manifest["files"].items():
        entry["sha256"] = sha256_file(bundle / name)
        entry["bytes"] = (bundle / name).stat().st_size
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.fixture
def g2p(tmp_path: Path) -> Path:
    """A copy of the built-in G2P bundle (31 source symbols, 73 target symbols)."""
    bundle = tmp_path / "g2p"
    shutil.copytree(load_bundle("g2p-en").path, bundle)
    return bundle


def inspect(bundle: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["inspect", str(bundle)])
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, (BundleError, SystemExit)
    ), result.exception
    message = str(result.exception) if isinstance(result.exception, BundleError) else ""
    return result.exit_code, result.output + message


def test_a_smaller_source_tokenizer_is_refused(g2p: Path) -> None:
    Tokenizer.train_char(["abcdefghij"]).save(g2p / C.TOKENIZER_FILE)  # 14 ids
    rehash(g2p)
    want = r"source tokenizer has 14 ids but config.json's src_vocab_size is 31"
    with pytest.raises(BundleError, match=want):
        load_bundle(g2p)
    code, output = inspect(g2p)
    assert code == 1 and "src_vocab_size is 31" in output and "Traceback" not in output


def test_the_source_tokenizer_as_target_is_refused(g2p: Path) -> None:
    shutil.copy(g2p / C.TOKENIZER_FILE, g2p / TARGET_TOKENIZER_FILE)
    rehash(g2p)
    with pytest.raises(BundleError, match=r"target tokenizer has 31 ids but .* is 73"):
        Generator.load(g2p, providers="cpu", threads=1)


def test_special_ids_must_match_config(g2p: Path) -> None:
    config = json.loads((g2p / C.CONFIG_FILE).read_text())
    config["model"]["eos_id"], config["model"]["unk_id"] = 3, 2
    (g2p / C.CONFIG_FILE).write_text(json.dumps(config))
    rehash(g2p)
    with pytest.raises(BundleError, match=r"source tokenizer's eos_id is 2 but config.json's is 3"):
        load_bundle(g2p)


def test_a_config_graph_mismatch_is_one_line_with_its_root_cause(g2p: Path) -> None:
    config = json.loads((g2p / C.CONFIG_FILE).read_text())
    config["model"]["d_model"] = 128  # divisible by n_heads: a valid config, wrong graphs
    (g2p / C.CONFIG_FILE).write_text(json.dumps(config))
    rehash(g2p)
    with pytest.raises(BundleError, match=r"config\.json says d_model 128 but the graphs say 256 "):
        Generator.load(g2p, providers="cpu", threads=1)
    code, output = inspect(g2p)  # shown as ok before: inspect checked no graph
    assert code == 1 and "d_model 128 but the graphs say 256" in output
    assert "check: ok" not in output and len(output.splitlines()[-1]) < 300


@pytest.mark.parametrize("content", ["[]", '{"format_version": 3, "files": []}', "{"])
def test_inspect_refuses_a_malformed_manifest_in_one_line(g2p: Path, content: str) -> None:
    (g2p / C.MANIFEST_FILE).write_text(content)
    code, output = inspect(g2p)
    assert code == 1 and "manifest.json" in output and "Traceback" not in output
    with pytest.raises(BundleError, match=r"manifest\.json"):
        load_bundle(g2p)


def test_inspect_of_a_truncated_config_says_so(g2p: Path) -> None:
    text = (g2p / C.CONFIG_FILE).read_text()
    (g2p / C.CONFIG_FILE).write_text(text[: len(text) // 2])
    rehash(g2p)
    code, output = inspect(g2p)
    assert code == 1 and "config.json cannot be" in output and "Traceback" not in output


def test_inspect_of_a_graph_onnxruntime_refuses(g2p: Path) -> None:
    manifest = read_manifest(g2p)
    decoder = manifest["variants"]["int8"]["decoder"]
    (g2p / decoder).write_bytes(b"not an onnx graph")
    rehash(g2p)
    code, output = inspect(g2p)
    assert code == 1 and f"onnxruntime cannot load {g2p / decoder}" in output
