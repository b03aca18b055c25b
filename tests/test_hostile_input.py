"""Hostile input (issue 24, classes 4, 5, 6 and 11): the same answer from the CLI and the
Python API, no invented answer without a signal, normalisation as part of the model, and one
batching policy."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions
from edgeseq.runtime.tokenizer import Tokenizer

NOTHING_KNOWN = ["", "   ", "\t", "😀😀", "Հայերեն", "汉字"]


@pytest.fixture(scope="module")
def g2p() -> Generator:
    return Generator.load("g2p-en", providers="cpu", threads=1)


def cli_lines(args: list[str]) -> tuple[list[str], str]:
    result = CliRunner().invoke(cli, ["generate", "g2p-en", "--provider", "cpu", "--threads", "1",
                                      *args])  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines(), result.stderr


def test_empty_input_is_skipped_in_api_and_cli_alike(g2p: Generator) -> None:
    [result] = g2p.generate([""])
    assert result.skipped == "empty" and result.text == "" and result.token_ids == ()
    lines, _ = cli_lines([""])
    assert lines == [""]


@pytest.mark.parametrize("text", NOTHING_KNOWN)
def test_input_without_a_known_symbol_is_not_answered(g2p: Generator, text: str) -> None:
    [result] = g2p.generate([text])
    assert result.text == "" and result.skipped in ("empty", "unknown") and not result.finished
    lines, stderr = cli_lines(["--json", text])
    row = json.loads(lines[0])
    assert row["output"] == "" and row["skipped"] == result.skipped
    if result.skipped == "unknown":
        assert "no symbol of the source vocabulary, output left empty: argument 1" in stderr


def test_the_stream_of_a_skipped_input_is_empty(g2p: Generator) -> None:
    assert list(g2p.stream("😀")) == []


@pytest.mark.parametrize("variant", ["HELLO", "Hello", "  hello\t", "hel\u006co"])
def test_normalisation_is_part_of_the_model(g2p: Generator, variant: str) -> None:
    want = g2p.generate(["hello"])[0].text
    assert want == "HH AH0 L OW1"
    assert g2p.generate([variant])[0].text == want
    lines, stderr = cli_lines([variant])
    assert lines == [want] and "warning" not in stderr


def test_nfc_composes_before_lookup() -> None:
    tok = Tokenizer.train("char", ["café"], normalize=("nfc", "lowercase"))
    assert tok.encode("CAFE\u0301") == tok.encode("café")  # e + combining acute -> é
    assert tok.unk_id not in tok.encode("CAFE\u0301")


def test_the_shipped_tokenizer_declares_its_normalisation(g2p: Generator) -> None:
    data = json.loads(g2p.tokenizers.source.to_str())
    steps = [n["type"] for n in data["normalizer"]["normalizers"]]
    assert steps == ["NFC", "Strip", "Lowercase"]


def test_output_cut_before_the_end_is_flagged_on_stderr(g2p: Generator) -> None:
    lines, stderr = cli_lines(["--max-new-tokens", "2", "hello", "a"])
    assert len(lines) == 2
    assert "output cut at --max-new-tokens 2 before </s>: argument 1" in stderr
    results = g2p.generate(["hello", "a"], GenerationOptions(max_new_tokens=2))
    assert not results[0].finished and lines == [r.text for r in results]


def test_cli_and_api_batch_the_same_way_with_int8(g2p: Generator, tmp_path) -> None:
    """The built-in bundle is int8: a result may depend on its batch, so the CLI's and the
    API's batches must be the same groups for every input, blank lines included."""
    words = ["", "zyzzyva", "a", "photosynthesis", "😀", "knight", "x"] * 6
    path = tmp_path / "words.txt"
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    for batch in ("1", "4", "32"):
        lines, _ = cli_lines(["--input", str(path), "--batch-size", batch])
        options = GenerationOptions(batch_size=int(batch))
        assert lines == [r.text for r in g2p.generate(words, options)]


def test_batches_are_groups_in_input_order(g2p: Generator, monkeypatch) -> None:
    seen: list[int] = []
    real = g2p.step_model.start

    def start(src_ids):
        seen.append(src_ids.shape[0])
        return real(src_ids)

    monkeypatch.setattr(g2p.step_model, "start", start)
    g2p.generate(["a", "", "bb", "ccc", "dddd", "😀", "e"], GenerationOptions(batch_size=3))
    assert seen == [2, 2, 1]  # (a, -, bb) (ccc, dddd, -) (e): skipped inputs hold their place
