"""Knowledge distillation (`edgeseq train --teacher`), on the ~1 s reverse task."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.nn import functional as F

from edgeseq.build_model.checkpoint import load_checkpoint, save_checkpoint
from edgeseq.build_model.distill import distillation_loss
from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.build_model.train import Recipe, train
from edgeseq.cli.main import cli
from edgeseq.runtime.errors import CheckpointError, ConfigError
from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def teacher(small_reverse_task, small_recipe_factory, tmp_path_factory) -> Path:
    """A reverse model trained 60 steps: OUT/last."""
    out = tmp_path_factory.mktemp("teacher") / "run"
    train(small_reverse_task, small_recipe_factory(epochs=10), out, max_steps=60, progress=False)
    return (out / "last").resolve()


def _log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_distillation_loss_is_the_kl_to_the_teachers_mean_on_unmasked_positions() -> None:
    torch.manual_seed(0)
    student, a, b = (torch.randn(2, 3, 7) for _ in range(3))
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert distillation_loss(student, [student], mask, 1.0).abs() < 1e-6
    p = (F.softmax(a, -1) + F.softmax(b, -1)) / 2
    kl = (p * (p.log() - F.log_softmax(student, -1))).sum(-1)
    want = kl[mask].mean()
    torch.testing.assert_close(distillation_loss(student, [a, b], mask, 1.0), want)
    changed = student.clone()
    changed[0, 2] += 5.0  # a padding position
    torch.testing.assert_close(distillation_loss(changed, [a, b], mask, 1.0), want)
    p2 = F.softmax(a / 2, -1)
    kl2 = (p2 * (p2.log() - F.log_softmax(student / 2, -1))).sum(-1)
    torch.testing.assert_close(distillation_loss(student, [a], mask, 2.0), kl2[mask].mean() * 4)


def test_a_student_equal_to_its_teacher_has_nothing_to_learn(
    teacher: Path, small_recipe_factory, tmp_path: Path
) -> None:
    """Without dropout and with distill_weight 1, a student started from its teacher's weights
    begins at loss 0; without the teacher the same run starts at the cross-entropy."""
    recipe = small_recipe_factory(dropout=0.0, label_smoothing=0.0, distill_weight=1.0, log_every=1)
    kd, plain = tmp_path / "kd", tmp_path / "plain"
    train(None, recipe, kd, init_from=teacher, teachers=[teacher], max_steps=2, progress=False)
    train(None, recipe, plain, init_from=teacher, max_steps=2, progress=False)
    kd_steps = [r for r in _log(kd) if r["event"] == "step"]
    plain_steps = [r for r in _log(plain) if r["event"] == "step"]
    assert kd_steps[0]["loss"] < 1e-5 < 0.05 < plain_steps[0]["loss"]
    assert kd_steps[0]["nll"] == pytest.approx(plain_steps[0]["loss"], rel=1e-4)
    assert _log(kd)[0]["teachers"] == [str(teacher)] and "teachers" not in _log(plain)[0]


def test_a_resumed_run_keeps_its_teachers(
    teacher: Path, small_reverse_task, small_recipe_factory, tmp_path: Path
) -> None:
    """The teachers are part of the run: `--resume` loads them again and refuses new ones."""
    run = tmp_path / "run"
    recipe = small_recipe_factory(epochs=2, distill_weight=0.7, distill_temperature=2.0)
    train(small_reverse_task, recipe, run, teachers=[teacher, teacher], max_steps=3, progress=False)
    _, _, meta = load_checkpoint(run / "last")
    assert meta.train_state["teachers"] == [str(teacher)] * 2
    summary = train(None, None, run, resume=True, progress=False)
    assert summary["finished"] and _log(run)[-2]["event"] == "eval"
    assert [r["teachers"] for r in _log(run) if r["event"] == "start"] == [[str(teacher)] * 2] * 2
    with pytest.raises(ConfigError, match="keeps the run's own"):
        train(None, None, run, resume=True, epochs=3, teachers=[teacher])


def test_a_teacher_must_share_the_students_vocabulary_and_length(
    teacher: Path, small_recipe_factory, tmp_path: Path
) -> None:
    model, tokenizers, meta = load_checkpoint(teacher)
    specials = Tokenizer.train_char(["x"]).vocab_size - 1
    other = Tokenizer.train_char(["ABCDEFGHIJKLMNOP"[: tokenizers.source.vocab_size - specials]])
    assert other.vocab_size == tokenizers.source.vocab_size  # same size, other symbols
    foreign = save_checkpoint(
        tmp_path / "foreign", model, TokenizerPair(other, tokenizers.target), meta.task, {}
    )
    recipe = small_recipe_factory(epochs=1)
    with pytest.raises(ConfigError, match="another source vocabulary"):
        train(None, recipe, tmp_path / "a", init_from=teacher, teachers=[foreign])
    short = Seq2SeqTransformer(dataclasses.replace(model.cfg, max_len=4))
    short_path = save_checkpoint(tmp_path / "short", short, tokenizers, meta.task, {})
    with pytest.raises(ConfigError, match="reads at most 4 tokens"):
        train(None, recipe, tmp_path / "b", init_from=teacher, teachers=[short_path])
    with pytest.raises(CheckpointError, match="does not exist"):
        train(None, recipe, tmp_path / "c", init_from=teacher, teachers=[tmp_path / "nowhere"])


def test_recipe_checks_the_distillation_fields(small_recipe_factory) -> None:
    with pytest.raises(ConfigError) as info:
        Recipe.from_dict({**small_recipe_factory().to_dict(), "distill_weight": 1.5,
                          "distill_temperature": 0})  # fmt: skip
    assert "distill_weight must be in [0, 1]" in str(info.value)
    assert "distill_temperature must be a number > 0" in str(info.value)


def test_train_command_takes_teachers(
    teacher: Path, small_recipe_factory, tmp_path: Path, monkeypatch
) -> None:
    """A relative --teacher is recorded as an absolute path, so --resume works from anywhere."""
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps(small_recipe_factory(epochs=1).to_dict()))
    monkeypatch.chdir(teacher.parent)
    args = ["train", "--init-from", str(teacher), "--teacher", teacher.name, "--recipe"]
    result = CliRunner().invoke(cli, [*args, str(recipe), "--out", str(tmp_path / "r"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert _log(tmp_path / "r")[0]["teachers"] == [str(teacher)]
