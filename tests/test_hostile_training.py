"""Training never reports a perfect score on nothing (issue 24, class 9): an empty dev split,
or a max_len that admits no training (or no dev) pair, is refused before the first step; pairs
left out for length are said plainly on the console."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeseq.build_model.tasks import load_task, split_of
from edgeseq.build_model.train import train
from edgeseq.cli.main import cli
from edgeseq.runtime.errors import DataError


def test_an_empty_dev_split_is_refused(small_recipe_factory, tmp_path: Path) -> None:
    words = [f"w{a}{b}" for a in "abcdefgh" for b in "abcdefgh"]
    train_only = [w for w in words if split_of(w) == "train"][:12]
    corpus = tmp_path / "twelve.tsv"
    corpus.write_text("".join(f"{w}\t{w.upper()}\n" for w in train_only))
    task = load_task("tsv", path=str(corpus))
    assert task.dev == [] and len(task.train) == 12
    out = tmp_path / "run"
    with pytest.raises(DataError, match=r"the dev split of task tsv \(.*twelve\.tsv\) is empty"):
        train(task, small_recipe_factory(), out, threads=1, progress=False)
    assert not out.exists()  # refused before anything was written, no metric saved


def test_a_max_len_that_admits_no_training_pair_is_refused(
    small_recipe_factory, tmp_path: Path
) -> None:
    task = load_task("reverse", size=200, min_len=10, max_len=12)  # 11..13 positions
    out = tmp_path / "run"
    with pytest.raises(
        DataError,
        match=r"no training pair of task reverse fits max_len 8: all \d+ need more positions "
        r".*max_len 11 admits the shortest, 13 admits all",
    ):
        train(task, small_recipe_factory(max_len=8), out, threads=1, progress=False)
    assert not out.exists()


def test_a_max_len_that_admits_no_dev_pair_is_refused(small_recipe_factory, tmp_path) -> None:
    lines = [f"{w}\t{w.upper()}\n" for w in ("ab", "abc", "bca", "cab", "ba", "cb", "acb")]
    dev_words = [f"{a}{b}{c}{d}{e}" for a in "xyz" for b in "xyz" for c in "xyz" for d in "xy"
                 for e in "xy"]  # fmt: skip
    long_dev = [w * 3 for w in dev_words if split_of(w * 3) == "dev"][:3]
    lines += [f"{w}\t{w.upper()}\n" for w in long_dev]  # 16 positions each
    corpus = tmp_path / "short-train-long-dev.tsv"
    corpus.write_text("".join(lines))
    task = load_task("tsv", path=str(corpus))
    assert task.dev and all(len(s) == 15 for s, _ in task.dev)
    assert any(len(s) < 7 for s, _ in task.train)
    with pytest.raises(DataError, match=r"no dev pair .* fits max_len 8 .*dev metrics would"):
        train(task, small_recipe_factory(max_len=8), tmp_path / "r", threads=1, progress=False)


def test_pairs_left_out_for_length_are_counted_on_the_console(small_recipe_factory, tmp_path):
    """Pairs dropped for length were only in log.jsonl: now a warning line gives the count,
    the share, the longest kept and the max_len that keeps all."""
    task = load_task("reverse", size=300, min_len=1, max_len=12)
    corpus = tmp_path / "reverse.tsv"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in task.train + task.dev + task.test))
    recipe_file = tmp_path / "recipe.json"
    recipe_file.write_text(json.dumps(small_recipe_factory(max_len=8, epochs=1).to_dict()))
    args = [
        "train", "--task", "tsv", "--data", str(corpus), "--recipe", str(recipe_file),
        "--out", str(tmp_path / "run"), "--threads", "1", "--quiet",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    [line] = [x for x in result.stderr.splitlines() if "training pairs" in x]
    assert line.startswith("warning: ")
    log = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    start = json.loads(log[0])
    dropped, kept = start["dropped_too_long"], start["train_examples"]
    assert dropped > 0
    share = f"{100 * dropped / (dropped + kept):.1f}%"
    assert (
        f"{dropped} of {dropped + kept} training pairs ({share}) need more than max_len 8" in line
    )
    assert "the longest kept needs 8, max_len 13 would keep all" in line


def test_the_warning_comes_from_the_library_too(small_recipe_factory, tmp_path, caplog) -> None:
    task = load_task("reverse", size=200, min_len=5, max_len=9)
    with caplog.at_level(logging.WARNING, logger="edgeseq"):
        train(task, small_recipe_factory(max_len=8), tmp_path / "run", threads=1,
              progress=False, max_steps=1)  # fmt: skip
    [message] = [r.getMessage() for r in caplog.records if "training pairs" in r.getMessage()]
    assert "need more than max_len 8 positions and are left out" in message
