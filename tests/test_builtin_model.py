"""The g2p-en bundle shipped as package data: checked against the repository's checkpoint,
found by name by the API and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeseq.cli.main import main
from edgeseq.runtime import constants as C
from edgeseq.runtime.builtin import BUILTIN_DIR, builtin_bundles, resolve_bundle
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.manifest import check_files, read_manifest

REPOSITORY = Path(__file__).resolve().parents[1]
CHECKPOINT = REPOSITORY / "models" / "g2p-en"
BUDGET_BYTES = 45_000_000  # models/ plus the packaged bundles


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_the_packaged_bundle_verifies_and_matches_the_checkpoint() -> None:
    path = builtin_bundles()["g2p-en"]
    assert path == BUILTIN_DIR / "g2p-en"
    manifest = read_manifest(path)
    check_files(path, manifest)
    assert sorted(manifest["files"]) == sorted(
        p.name for p in path.iterdir() if p.name != C.MANIFEST_FILE
    )
    assert sorted(manifest["variants"]) == ["int8"] and manifest["dropped_variants"] == ["fp32"]
    assert manifest["parity"]["passed"] is True
    assert manifest["variants"]["int8"]["gate"]["passed"] is True
    bundle = load_bundle("g2p-en")
    assert bundle.default_variant == "int8"
    saved = json.loads((CHECKPOINT / C.CONFIG_FILE).read_text(encoding="utf-8"))
    # A checkpoint saved before a field existed reads with that field's default.
    assert bundle.config.to_dict() == ModelConfig.from_dict(saved).to_dict()
    for name in ("tokenizer.json", "tokenizer.target.json", "tokenizer_config.json"):
        assert (path / name).read_bytes() == (CHECKPOINT / name).read_bytes(), name
    task = json.loads((CHECKPOINT / "task.json").read_text(encoding="utf-8"))
    assert bundle.task == {"name": task["name"], "options": task["options"]}


def test_models_and_packaged_bundle_fit_the_budget() -> None:
    assert _size(REPOSITORY / "models") + _size(BUILTIN_DIR) < BUDGET_BYTES


def test_api_and_cli_generate_by_name(capsys: pytest.CaptureFixture) -> None:
    gen = Generator.load("g2p-en", providers="cpu", threads=1)
    [result] = gen.generate(["hello"])
    assert result.finished and result.text.startswith("HH ") and result.text.endswith(" L OW1")
    main(["generate", "g2p-en", "hello", "--provider", "cpu", "--threads", "1"])
    captured = capsys.readouterr()
    assert captured.out == result.text + "\n"
    main(["models"])
    assert captured.err == "" and "g2p-en" in capsys.readouterr().out


def test_a_path_that_exists_wins_and_unknown_names_say_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g2p-en").mkdir()
    assert resolve_bundle("g2p-en") == Path("g2p-en")
    with pytest.raises(BundleError, match=r"g2p-en/manifest\.json is missing"):
        load_bundle("g2p-en")
    with pytest.raises(BundleError, match=r"g2p-fr is neither a bundle directory nor a built-in"):
        Generator.load("g2p-fr")


@pytest.mark.slow
def test_re_exporting_the_checkpoint_gives_the_same_parity_verdict(tmp_path: Path) -> None:
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import export_checkpoint

    shipped = read_manifest(BUILTIN_DIR / "g2p-en")
    # As `make builtin-model` exports it: standard operators (export/builtin.py).
    options = ExportOptions(inputs=50, fuse=False)
    manifest = export_checkpoint(CHECKPOINT, tmp_path / "again", options)
    assert manifest["parity"]["passed"] == shipped["parity"]["passed"] is True
    for key in ("opset", "ir_version", "min_onnxruntime"):
        assert manifest[key] == shipped[key], key
    for level in ("level1", "level2", "level3"):
        assert manifest["parity"][level]["passed"] == shipped["parity"][level]["passed"]
