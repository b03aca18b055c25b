"""`edgeseq export` / `edgeseq verify` on a checkpoint directory (one export, ~10 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from edgeseq.cli.main import cli
from edgeseq.runtime import constants as C
from edgeseq.runtime.errors import BundleError, ParityError

checkpoint = pytest.importorskip("edgeseq.build_model.checkpoint")


def _save(path: Path, model, tokenizers, task: dict) -> Path:
    return checkpoint.save_checkpoint(path, model, tokenizers, task, {"step": 0})


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    """A tiny random model on the reverse task's tokenizers, saved and exported by the CLI."""
    from edgeseq.build_model.model import Seq2SeqTransformer
    from edgeseq.build_model.tasks import load_task
    from edgeseq.runtime.config import ModelConfig

    task = load_task("reverse")
    tokenizers = task.build_tokenizers()
    cfg = ModelConfig(
        src_vocab_size=tokenizers.source.vocab_size, tgt_vocab_size=tokenizers.target.vocab_size,
        d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=48, max_len=48,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg).eval()
    root = tmp_path_factory.mktemp("cli")
    ckpt = _save(root / "ckpt", model, tokenizers, task.describe())
    bundle = root / "bundle"
    result = CliRunner().invoke(cli, ["export", str(ckpt), "--out", str(bundle)])
    assert result.exit_code == 0, result.output
    return ckpt, bundle, result


def test_export_prints_progress_and_records_task_parity(exported) -> None:
    ckpt, bundle, result = exported
    steps = ["load", "export encoder", "export decoder", "check", "write", "MB, exported in"]
    steps += ["parity level 1", "parity level 2", "parity level 3", "total"]
    for step in steps:
        assert step in result.output, step
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text())
    level3 = manifest["parity"]["level3"]
    assert level3["source"] == "task reverse: dev 200" and level3["identical"] == 200
    config = json.loads((bundle / C.CONFIG_FILE).read_text())
    assert config["task"] == checkpoint.read_meta(ckpt).task  # {"name": "reverse", ...}
    assert "[torch.onnx]" not in result.output  # the exporter's own progress is silenced


def test_export_refuses_existing_output_before_loading(exported) -> None:
    ckpt, bundle, _ = exported
    result = CliRunner().invoke(cli, ["export", str(ckpt), "--out", str(bundle)])
    assert result.exit_code != 0
    assert isinstance(result.exception, BundleError)
    assert "already exists; pass --force" in str(result.exception)
    assert "load" not in result.output


def test_verify_reruns_parity(exported) -> None:
    ckpt, bundle, _ = exported
    result = CliRunner().invoke(cli, ["verify", str(bundle), "--checkpoint", str(ckpt)])
    assert result.exit_code == 0, result.output
    assert "checksums of 5 files match" in result.output
    assert "200/200" in result.output and "parity passed" in result.output


def test_verify_fails_with_numbers_against_changed_weights(exported, tmp_path) -> None:
    ckpt, bundle, _ = exported
    model, tokenizers, meta = checkpoint.load_checkpoint(ckpt)
    with torch.no_grad():
        model.encoder_layers[0].ffn.w_1.weight[0, 0] += 0.5
    changed = _save(tmp_path / "changed", model, tokenizers, meta.task)
    result = CliRunner().invoke(cli, ["verify", str(bundle), "--checkpoint", str(changed)])
    assert isinstance(result.exception, ParityError)
    assert result.exception.report["level1"]["max_abs_diff"]["memory"] > 1e-4
    assert "FAIL" in result.output and "parity FAILED" in result.output


def test_verify_refuses_a_checkpoint_of_another_model(exported, export_model_factory, tmp_path):
    _, bundle, _ = exported
    model, tokenizers = export_model_factory("post-sin-relu")
    other = _save(tmp_path / "other", model, tokenizers, {"name": "reverse", "options": {}})
    result = CliRunner().invoke(cli, ["verify", str(bundle), "--checkpoint", str(other)])
    assert isinstance(result.exception, BundleError)
    assert "another config" in str(result.exception)


def test_max_new_tokens_bounds_the_parity_decodes(exported, tmp_path) -> None:
    """--max-new-tokens: level 3 of a random model (which never ends an output) decodes that
    many tokens instead of max_len (48)."""
    ckpt, _, _ = exported
    bundle = tmp_path / "short"
    args = ["export", str(ckpt), "--out", str(bundle), "--max-new-tokens", "5", "--inputs", "8"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    level3 = json.loads((bundle / C.MANIFEST_FILE).read_text())["parity"]["level3"]
    assert level3["max_new_tokens"] == 5 and level3["inputs"] == 8


def test_parity_budget_comes_from_the_caller_then_the_checkpoint() -> None:
    from types import SimpleNamespace

    from edgeseq.export.options import ExportOptions, with_parity_budget
    from edgeseq.export.sources.generation_config import GenerationRecord

    nllb = SimpleNamespace(generation=GenerationRecord({"max_new_tokens": 199, "beam_size": 4}))
    unset = SimpleNamespace(generation=GenerationRecord({"beam_size": 4}))
    native = SimpleNamespace(generation=None)
    assert with_parity_budget(ExportOptions(), nllb).max_new_tokens == 199  # type: ignore[arg-type]
    assert with_parity_budget(ExportOptions(max_new_tokens=7), nllb).max_new_tokens == 7  # type: ignore[arg-type]
    assert with_parity_budget(ExportOptions(), unset).max_new_tokens is None  # type: ignore[arg-type]
    assert with_parity_budget(ExportOptions(), native).max_new_tokens is None  # type: ignore[arg-type]
