"""A bf16 recipe on a CPU without native bfloat16 warns, saying what to do."""

from __future__ import annotations

import logging

import pytest
import torch
from click.testing import CliRunner

from edgeseq.build_model import precision
from edgeseq.build_model.recipe import Recipe
from edgeseq.cli.main import cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_slowdown_is_a_measured_positive_ratio() -> None:
    ratio = precision.bf16_slowdown(repeats=1)
    assert 0 < ratio < 1000


def test_slowdown_leaves_the_global_rng_alone() -> None:
    """train() measures after a resumed run restored its RNG state for dropout."""
    before = torch.get_rng_state()
    precision.bf16_slowdown(repeats=1)
    assert torch.equal(torch.get_rng_state(), before)


def test_every_command_echoes_library_warnings_on_stderr(tmp_path, capsys) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path / "no-bundle")])
    assert result.exit_code != 0
    logging.getLogger(precision.__name__).warning("bf16 autocast is 4.2x slower")
    assert capsys.readouterr().err.endswith("warning: bf16 autocast is 4.2x slower\n")


@pytest.mark.parametrize(("ratio", "warns"), [(4.2, True), (0.6, False)])
def test_bf16_recipe_warns_only_when_bf16_is_slower(
    monkeypatch, caplog, ratio: float, warns: bool
) -> None:
    monkeypatch.setattr(precision, "bf16_slowdown", lambda: ratio)
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        assert precision.warn_if_bf16_slow(Recipe.from_dict({"precision": "bf16"})) == ratio
    messages = [r.getMessage() for r in caplog.records]
    if warns:
        assert len(messages) == 1
        assert "4.2x slower than fp32" in messages[0] and '"precision": "fp32"' in messages[0]
    else:
        assert messages == []


def test_fp32_recipe_measures_nothing(monkeypatch) -> None:
    def fail() -> float:
        raise AssertionError("an fp32 recipe must not time bf16")

    monkeypatch.setattr(precision, "bf16_slowdown", fail)
    assert precision.warn_if_bf16_slow(Recipe.from_dict({"precision": "fp32"})) is None
