"""A bundle is closed: every file its manifest names resolves inside the bundle directory,
even when the manifest carries the true checksum of a file elsewhere."""

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
from edgeseq.runtime.manifest import read_manifest, sha256_file

OUTSIDE = "outside the bundle directory"


def _rename_in_manifest(bundle: Path, old: str, new: str) -> None:
    """Point the manifest's decoder entries at `new` (its checksum table and the fp32
    variant), keeping the file's true sha256: only the checksum check would pass."""
    manifest = read_manifest(bundle)
    manifest["files"][new] = manifest["files"].pop(old)
    manifest["variants"]["fp32"]["decoder"] = new
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")


@pytest.fixture
def copy(runtime_case, tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(runtime_case.bundle, bundle)
    return bundle


def test_a_manifest_path_that_leaves_the_directory_is_refused(copy: Path) -> None:
    outside = copy.parent / "outside"
    outside.mkdir()
    shutil.move(copy / C.DECODER_FILE, outside / C.DECODER_FILE)
    _rename_in_manifest(copy, C.DECODER_FILE, f"../outside/{C.DECODER_FILE}")
    with pytest.raises(
        BundleError, match=r"names '\.\./outside/decoder\.onnx', which is " + OUTSIDE
    ):
        load_bundle(copy)
    result = CliRunner().invoke(cli, ["inspect", str(copy)])
    assert result.exit_code != 0 and OUTSIDE in str(result.exception)


def test_an_absolute_manifest_path_is_refused(copy: Path) -> None:
    absolute = str((copy / C.DECODER_FILE).resolve())
    _rename_in_manifest(copy, C.DECODER_FILE, absolute)
    with pytest.raises(BundleError, match=OUTSIDE):
        load_bundle(copy)


def test_a_link_to_a_file_outside_is_refused(copy: Path) -> None:
    outside = copy.parent / "elsewhere.onnx"
    shutil.move(copy / C.DECODER_FILE, outside)
    (copy / C.DECODER_FILE).symlink_to(outside)
    assert (
        sha256_file(copy / C.DECODER_FILE) == read_manifest(copy)["files"][C.DECODER_FILE]["sha256"]
    )  # the checksum alone would accept it
    with pytest.raises(BundleError, match=r"names 'decoder\.onnx', which is " + OUTSIDE):
        load_bundle(copy)


def test_a_link_inside_the_bundle_is_fine(copy: Path) -> None:
    (copy / "graphs").mkdir()
    shutil.move(copy / C.DECODER_FILE, copy / "graphs" / C.DECODER_FILE)
    (copy / C.DECODER_FILE).symlink_to(Path("graphs") / C.DECODER_FILE)
    assert load_bundle(copy).config is not None
