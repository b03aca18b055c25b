"""Training loop, checkpoints, resume and the train/evaluate commands, on a ~1 s task."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from edgeseq.build_model.checkpoint import load_checkpoint, save_checkpoint
from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.build_model.train import Recipe, learning_rate, train
from edgeseq.cli.main import cli, main
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import CheckpointError, ConfigError, OptionsError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_drives_the_loss_down_and_writes_the_run(trained_run) -> None:
    out, summary = trained_run
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["event"] == "step"]
    nlls = [r["nll"] for r in records if r["event"] == "step"]  # without label smoothing
    assert len(nlls) == len(losses) and nlls[-1] < losses[-1]
    assert len(losses) == 60  # log_every 2, 120 steps
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5  # 2.62 -> 1.86 here
    assert summary["steps"] == 120 and summary["stopped_early"] and not summary["finished"]
    assert records[0]["event"] == "start" and records[-1]["event"] == "stop"
    evals = [r for r in records if r["event"] == "eval"]
    assert {"dev_loss", "exact_match", "wer", "per"} <= set(evals[-1])
    assert (out / "loss.png").stat().st_size > 1000
    for name in ("best", "last"):
        assert (out / name / "model.safetensors").is_file()
    assert (out / "last" / "train_state.safetensors").is_file()
    assert not (out / "best" / "train_state.safetensors").exists()  # best is for inference
    assert not list(out.rglob("*.pt")) + list(out.rglob("*.pkl")) + list(out.rglob(".*tmp*"))


def test_learning_rate_warms_up_then_decays_as_inverse_sqrt() -> None:
    d, warmup = 256, 100
    peak = learning_rate(warmup, d, warmup, 1.0)
    assert peak == pytest.approx(d**-0.5 * warmup**-0.5)
    assert learning_rate(50, d, warmup, 1.0) == pytest.approx(peak / 2)
    assert learning_rate(400, d, warmup, 2.0) == pytest.approx(2 * peak / 2)


def test_linear_schedule_shares_the_warm_up_and_falls_to_zero() -> None:
    d, warmup, total = 256, 100, 1100
    peak = learning_rate(warmup, d, warmup, 1.0)
    for step in (1, 50, 100):
        assert learning_rate(step, d, warmup, 1.0, "linear", total) == learning_rate(
            step, d, warmup, 1.0
        )
    assert learning_rate(600, d, warmup, 1.0, "linear", total) == pytest.approx(peak / 2)
    assert learning_rate(total, d, warmup, 1.0, "linear", total) == 0.0
    assert learning_rate(total + 5, d, warmup, 1.0, "linear", total) == 0.0
    with pytest.raises(ConfigError, match="total number of steps"):
        learning_rate(200, d, warmup, 1.0, "linear")
    with pytest.raises(ConfigError, match="schedule must be one of"):
        Recipe.from_dict({"schedule": "cosine"})


def test_linear_schedule_ends_at_zero_on_the_runs_last_step(
    small_reverse_task, small_recipe_factory, tmp_path: Path
) -> None:
    recipe = small_recipe_factory(epochs=2, schedule="linear", warmup=4, log_every=1)
    summary = train(small_reverse_task, recipe, tmp_path / "lin", threads=1, progress=False)
    records = [
        json.loads(line) for line in (tmp_path / "lin" / "log.jsonl").read_text().splitlines()
    ]
    lrs = [r["lr"] for r in records if r["event"] == "step"]
    assert records[0]["total_steps"] == summary["steps"] == len(lrs) > 8
    assert lrs[-1] == 0.0 and max(lrs) == lrs[3]  # peak at the end of warm-up
    assert all(a > b for a, b in itertools.pairwise(lrs[3:]))  # then strictly down


@pytest.mark.parametrize("tie_output", [False, True])
def test_checkpoint_round_trip_gives_identical_outputs(
    tie_output: bool, small_reverse_task, tmp_path: Path
) -> None:
    tokenizers = small_reverse_task.build_tokenizers()
    vocab = tokenizers.source.vocab_size
    sizes = dict(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32)
    cfg = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, tie_output=tie_output, **sizes)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg).eval()
    task = small_reverse_task.describe()
    path = save_checkpoint(tmp_path / "ckpt", model, tokenizers, task, {"step": 7})
    loaded, loaded_tokenizers, meta = load_checkpoint(path)
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 7, 6]])
    assert torch.equal(loaded(src, tgt), model(src, tgt))
    assert meta.task == task and meta.train_state["step"] == 7 and not meta.resumable
    assert loaded_tokenizers.shared and loaded_tokenizers.source.encode("abc") == [4, 5, 6]
    assert json.loads((path / "task.json").read_text())["name"] == "reverse"
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert ("output.weight" in names) != (tie_output and "tgt_embed.weight" in names)
    if tie_output:
        assert loaded.output.weight is loaded.tgt_embed.weight


def test_load_checkpoint_errors_say_what_is_wrong(trained_run, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist; pass a directory written by"):
        load_checkpoint(tmp_path / "nothing")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((trained_run[0] / "best" / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"incomplete: missing model\.safetensors, tokenizer"):
        load_checkpoint(broken)


def test_resume_continues_exactly(small_reverse_task, small_recipe_factory, tmp_path: Path) -> None:
    """2 epochs straight == 10 steps, stop, resume (mid-epoch 1, dropout on): same weights."""
    recipe = small_recipe_factory(epochs=2)
    straight = train(small_reverse_task, recipe, tmp_path / "a", seed=3, progress=False)
    stopped = train(
        small_reverse_task, recipe, tmp_path / "b", seed=3, max_steps=10, progress=False
    )
    assert stopped["stopped_early"] and stopped["epoch"] == 0 and stopped["batch_in_epoch"] == 10
    resumed = train(None, None, tmp_path / "b", resume=True, progress=False)
    assert resumed["finished"] and resumed["step"] == straight["step"] > 20
    a, _, _ = load_checkpoint(tmp_path / "a" / "last")
    b, _, _ = load_checkpoint(tmp_path / "b" / "last")
    for name, value in _weights(a).items():
        assert torch.equal(value, b.state_dict()[name]), name
    again = train(None, None, tmp_path / "b", resume=True, progress=False)
    assert "pass a larger --epochs" in again["message"]


def test_resume_keeps_the_epochs_override(
    small_reverse_task, small_recipe_factory, tmp_path: Path
) -> None:
    train(small_reverse_task, small_recipe_factory(epochs=5), tmp_path, epochs=1, progress=False)
    again = train(None, None, tmp_path, resume=True, progress=False)
    assert again["message"] == "already trained 1 epochs; pass a larger --epochs"
    more = train(None, None, tmp_path, resume=True, epochs=2, progress=False)
    assert more["finished"] and more["epoch"] == 2


def test_time_budget_stops_after_the_current_step_with_a_checkpoint(
    small_reverse_task, small_recipe_factory, tmp_path: Path
) -> None:
    summary = train(
        small_reverse_task, small_recipe_factory(), tmp_path, max_minutes=1e-9, progress=False
    )
    assert summary["steps"] == 1 and summary["stopped_early"]
    _, _, meta = load_checkpoint(tmp_path / "last")
    assert meta.resumable and meta.train_state["step"] == 1
    assert meta.train_state["batch_in_epoch"] == 1


def test_new_run_refuses_an_existing_run(
    trained_run, small_reverse_task, small_recipe_factory, tmp_path: Path
) -> None:
    with pytest.raises(CheckpointError, match=r"unfinished run .*--resume .*another --out"):
        train(small_reverse_task, small_recipe_factory(), trained_run[0], progress=False)
    with pytest.raises(CheckpointError, match="nothing to resume"):
        train(None, None, tmp_path / "empty", resume=True, progress=False)
    with pytest.raises(ConfigError, match=r"changes the model shape .*d_model 32 -> 64"):
        train(None, small_recipe_factory(d_model=64), trained_run[0], resume=True)


def test_resume_may_change_training_fields_and_dropout(
    small_reverse_task, small_recipe_factory, tmp_path: Path
) -> None:
    """A recipe given with resume swaps noise, precision and dropout in, and the log says so."""
    train(small_reverse_task, small_recipe_factory(epochs=1), tmp_path, progress=False)
    changed = small_recipe_factory(epochs=2, bucket_noise=0.0, precision="bf16", dropout=0.0)
    summary = train(None, changed, tmp_path, resume=True, progress=False)
    assert summary["finished"] and summary["epoch"] == 2
    starts = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    starts = [r for r in starts if r["event"] == "start"]
    assert "recipe_changed" not in starts[0] and "bf16_vs_fp32" not in starts[0]
    assert starts[1]["recipe_changed"]["precision"] == ["fp32", "bf16"]
    assert starts[1]["bf16_vs_fp32"] > 0  # measured on this CPU when the run uses bf16
    assert starts[1]["recipe_changed"]["bucket_noise"][1] == 0.0
    _, _, meta = load_checkpoint(tmp_path / "last")
    assert meta.train_state["recipe"]["precision"] == "bf16"
    model, _, _ = load_checkpoint(tmp_path / "last")
    assert model.cfg.dropout == 0.0


def test_init_from_starts_a_new_run_from_the_weights(
    trained_run, small_recipe_factory, tmp_path: Path
) -> None:
    """Step 0, fresh optimizer, the checkpoint's task and tokenizers; the shape must match."""
    source, _ = trained_run
    recipe = small_recipe_factory(epochs=1, dropout=0.0)
    summary = train(None, recipe, tmp_path / "ft", init_from=source / "last", max_steps=1)
    assert summary["step"] == 1
    a, tok_a, meta_a = load_checkpoint(source / "last")
    b, tok_b, meta_b = load_checkpoint(tmp_path / "ft" / "last")
    assert meta_b.task == meta_a.task and tok_b.source.vocab_size == tok_a.source.vocab_size
    moved = [k for k, v in _weights(a).items() if not torch.equal(v, b.state_dict()[k])]
    assert moved and len(moved) < len(_weights(a))  # one small step away, not a new model
    with pytest.raises(ConfigError, match="changes the model shape"):
        train(None, small_recipe_factory(d_ff=48), tmp_path / "x", init_from=source / "last")
    with pytest.raises(ConfigError, match="cannot be combined"):
        train(None, recipe, source, resume=True, init_from=source / "last")


def test_bad_recipe_names_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        Recipe.from_dict(
            {"d_model": 30, "n_heads": 4, "warmup": 0, "lr_factr": 1.0, "label_smoothing": 1.5}
        )
    message = str(info.value)
    assert "unknown recipe keys: lr_factr" in message and "divisible by n_heads" in message
    assert "warmup must be an integer >= 1" in message
    assert "label_smoothing must be in [0, 1)" in message


def test_shipped_recipes_are_valid() -> None:
    root = Path(__file__).parents[1]
    paths = [*root.glob("models/recipes/*.json"), *root.glob("models/g2p-en/recipes/*.json")]
    assert len(paths) >= 10, paths
    for path in paths:
        Recipe.load(path)
    small = Recipe.load(Path(__file__).parents[1] / "models/recipes/g2p-small.json")
    assert (small.model["d_model"], small.model["n_heads"], small.model["d_ff"]) == (256, 4, 1024)


@pytest.mark.parametrize(
    "args", [["--help"], ["train", "--help"], ["evaluate", "--help"], ["grow", "--help"]]
)
def test_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_evaluate_command_prints_metrics(trained_run) -> None:
    result = CliRunner().invoke(
        cli, ["evaluate", str(trained_run[0] / "best"), "--split", "dev", "--limit", "5", "--json"]
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output)
    assert metrics["count"] == 5 and metrics["split"] == "dev" and metrics["per"] >= 0
    text = CliRunner().invoke(
        cli, ["evaluate", str(trained_run[0] / "best"), "--limit", "3", "--beam", "2"]
    )
    assert text.exit_code == 0, text.output
    assert "test split, beam 2, 3 sources" in text.output and "exact_match" in text.output


def test_evaluate_scores_the_training_split_too(trained_run, small_reverse_task) -> None:
    """--split train scores every source of the training split, not of another split."""
    best = str(trained_run[0] / "best")
    result = CliRunner().invoke(cli, ["evaluate", best, "--split", "train", "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output)
    train_sources = len(small_reverse_task.references("train"))
    assert train_sources != len(small_reverse_task.references("dev"))
    assert metrics["split"] == "train" and metrics["count"] == train_sources


def test_evaluate_length_penalty_reaches_beam_search(trained_run, monkeypatch) -> None:
    """--length-penalty is passed to beam_search, named in the output, and needs --beam."""
    import edgeseq.cli.evaluate as evaluate_cli

    seen: list[float] = []
    real = evaluate_cli.beam_search

    def recording(model, src_ids, beam_size, max_new_tokens, length_penalty):
        seen.append(length_penalty)
        return real(model, src_ids, beam_size, max_new_tokens, length_penalty)

    monkeypatch.setattr(evaluate_cli, "beam_search", recording)
    best = str(trained_run[0] / "best")
    args = ["evaluate", best, "--limit", "4", "--beam", "2", "--json"]
    result = CliRunner().invoke(cli, [*args, "--length-penalty", "0.6"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["search"] == "beam 2, length penalty 0.6"
    assert seen and set(seen) == {0.6}
    seen.clear()
    default = CliRunner().invoke(cli, args)
    assert json.loads(default.output)["search"] == "beam 2" and set(seen) == {1.0}
    greedy = CliRunner().invoke(cli, ["evaluate", best, "--limit", "4", "--length-penalty", "0"])
    assert greedy.exit_code != 0 and "add --beam N" in str(greedy.exception)


def test_cli_errors_are_one_line(trained_run, capsys, tmp_path: Path) -> None:
    recipe = str(Path(__file__).parents[1] / "models/recipes/tiny.json")
    out = str(trained_run[0])
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "reverse", "--recipe", recipe, "--out", out, "--quiet"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--resume" in err and err.count("\n") == 1
    new = str(tmp_path / "new")
    with pytest.raises(SystemExit):
        main(["train", "--task", "copy", "--no-stress", "--recipe", recipe, "--out", new])
    assert capsys.readouterr().err == "error: --no-stress applies to --task g2p only\n"


def test_keep_epochs_and_average(small_reverse_task, small_recipe_factory, tmp_path: Path) -> None:
    """The last 2 of 3 epochs are kept; `edgeseq average` writes their element-wise mean."""
    recipe = small_recipe_factory(epochs=3, keep_epochs=2)
    train(small_reverse_task, recipe, tmp_path / "run", progress=False)
    kept = sorted((tmp_path / "run" / "epochs").iterdir())
    assert [p.name for p in kept] == ["002", "003"]
    out = tmp_path / "avg"
    result = CliRunner().invoke(cli, ["average", *map(str, kept), "--out", str(out)])
    assert result.exit_code == 0, result.output
    a, b = (load_checkpoint(p)[0].state_dict() for p in kept)
    averaged, _, meta = load_checkpoint(out)
    assert meta.train_state["averaged_steps"] == [
        load_checkpoint(p)[2].train_state["step"] for p in kept
    ]
    for name, value in averaged.state_dict().items():
        torch.testing.assert_close(value, (a[name] + b[name]) / 2, msg=name)
    assert not torch.equal(a["tgt_embed.weight"], b["tgt_embed.weight"])
    alone = CliRunner().invoke(
        cli, ["average", str(kept[1]), "--out", str(tmp_path / "x"), "--dtype", "float16"]
    )
    assert alone.exit_code == 0, alone.output  # one checkpoint: a half-size copy
    for name, value in load_checkpoint(tmp_path / "x")[0].state_dict().items():
        torch.testing.assert_close(value, b[name].half().float(), rtol=0, atol=0, msg=name)
    none = CliRunner().invoke(cli, ["average", "--out", str(tmp_path / "y")])
    assert none.exit_code != 0 and not (tmp_path / "y").exists()
    redo = CliRunner().invoke(cli, ["average", *map(str, kept), "--out", str(out)])
    assert redo.exit_code == 0, redo.output  # an earlier average is replaced
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    over_run = CliRunner().invoke(cli, ["average", *map(str, kept), "--out", str(tmp_path / "run")])
    assert over_run.exit_code != 0 and "choose a new directory" in str(over_run.exception)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before
    half = tmp_path / "avg16"
    result = CliRunner().invoke(
        cli, ["average", *map(str, kept), "--out", str(half), "--dtype", "float16"]
    )
    assert result.exit_code == 0 and "stored as float16" in result.output, result.output
    with safe_open(str(half / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert {f.get_tensor(k).dtype for k in names} == {torch.float16}
    size = (out / "model.safetensors").stat().st_size
    assert (half / "model.safetensors").stat().st_size < 0.55 * size
    model16, _, meta16 = load_checkpoint(half)
    assert meta16.train_state["weights_dtype"] == "float16"
    full = averaged.state_dict()
    for name, value in model16.state_dict().items():
        assert value.dtype == torch.float32, name
        torch.testing.assert_close(value, full[name].half().float(), rtol=0, atol=0, msg=name)


def test_evaluate_options_are_checked_by_generation_options(tmp_path) -> None:
    """The checkpoint path of `evaluate` refuses options with GenerationOptions' own words,
    before loading anything."""
    missing = str(tmp_path / "no-checkpoint")
    nan = ["evaluate", missing, "--beam", "2", "--length-penalty", "nan"]
    result = CliRunner().invoke(cli, nan)
    assert isinstance(result.exception, OptionsError)
    assert "length_penalty must be a finite number, got nan" in str(result.exception)
