"""`edgeseq generate`: inputs, options and every documented input rule (issue 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli
from edgeseq.runtime.errors import InputTooLongError, ProviderError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions


@pytest.fixture(scope="module")
def gen(runtime_case) -> Generator:
    return Generator.load(runtime_case.bundle, providers="cpu", threads=1)


def run(runtime_case, *args: str, stdin: bytes | None = None):
    """Invoke `edgeseq generate BUNDLE --provider cpu --threads 1 ARGS` in-process."""
    argv = ["generate", str(runtime_case.bundle), "--provider", "cpu", "--threads", "1", *args]
    return CliRunner().invoke(cli, argv, input=stdin)


def test_text_arguments_one_output_line_each(runtime_case, gen: Generator) -> None:
    result = run(runtime_case, "abc", "hgfedcba", "j")
    assert result.exit_code == 0, result.output
    expected = [r.text for r in gen.generate(["abc", "hgfedcba", "j"])]
    assert result.stdout.splitlines() == expected
    assert result.stdout.splitlines()[0] == "CBA"
    assert result.stderr == ""


def test_stdin_and_input_file_with_an_empty_line(runtime_case, gen, tmp_path: Path) -> None:
    data = b"abc\n\nhgfedcba\r\n"
    expected = [gen.generate(["abc"])[0].text, "", gen.generate(["hgfedcba"])[0].text]
    from_stdin = run(runtime_case, stdin=data)
    assert from_stdin.exit_code == 0, from_stdin.output
    assert from_stdin.stdout.splitlines() == expected
    (tmp_path / "in.txt").write_bytes(b"\xef\xbb\xbf" + data)  # a BOM is dropped
    from_file = run(runtime_case, "--input", str(tmp_path / "in.txt"))
    assert from_file.stdout.splitlines() == expected


def test_json_lines_with_nbest(runtime_case, gen: Generator) -> None:
    result = run(runtime_case, "--json", "--beam", "3", "--n-best", "2", stdin=b"abc\n\n")
    assert result.exit_code == 0, result.output
    first, empty = [json.loads(line) for line in result.stdout.splitlines()]
    best = gen.generate(["abc"], GenerationOptions(beam_size=3, n_best=2))[0]
    assert first["index"] == 1 and first["input"] == "abc" and first["output"] == best.text
    assert first["ids"] == list(best.token_ids) and first["tokens"] == list(best.text)
    assert first["score"] == pytest.approx(best.score) and first["finished"] is True
    assert [c["output"] for c in first["nbest"]] == [c.text for c in best.nbest]
    assert empty == {"index": 2, "input": "", "output": "", "skipped": "empty"}


def test_sampling_options_and_stream(runtime_case, gen: Generator) -> None:
    args = ("--sample", "--seed", "4", "--temperature", "1.5", "--top-k", "5", "--top-p", "0.9")
    plain = run(runtime_case, *args, "abc", "hgfedcba")
    options = GenerationOptions(sample=True, seed=4, temperature=1.5, top_k=5, top_p=0.9)
    assert plain.stdout.splitlines() == [r.text for r in gen.generate(["abc", "hgfedcba"], options)]
    assert run(runtime_case, *args, "abc", "hgfedcba").stdout == plain.stdout
    streamed = run(runtime_case, *args, "--stream", "abc", "hgfedcba")
    assert streamed.exit_code == 0 and streamed.stdout == plain.stdout


def test_batch_size_and_max_new_tokens(runtime_case) -> None:
    result = run(runtime_case, "--batch-size", "1", "--max-new-tokens", "2", "abcdef", "ghij")
    assert result.exit_code == 0
    assert [len(line) for line in result.stdout.splitlines()] == [2, 2]


def test_an_over_long_line_fails_naming_it_before_any_output(runtime_case) -> None:
    result = run(runtime_case, stdin=b"abc\n" + b"a" * 25 + b"\nj\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert isinstance(result.exception, InputTooLongError)
    assert str(result.exception) == (
        "line 2 has 26 source tokens with </s> but the model's max_len is 20; "
        "shorten it or pass --truncate"
    )


def test_truncate_cuts_with_one_warning(runtime_case) -> None:
    result = run(runtime_case, "--truncate", stdin=b"abc\n" + b"a" * 25 + b"\n" + b"b" * 30 + b"\n")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3
    first, *rest = result.stderr.splitlines()
    assert first == "warning: cut to max_len 20 tokens (with </s>): line 2, line 3"
    # Whether the tiny model's outputs of the cut inputs end before max_len depends on the
    # CPU's arithmetic (an untrained model); that has its own warning line.
    assert all(line.startswith("warning: output cut at the model's max_len") for line in rest)


def test_unknown_symbols_and_bad_bytes_warn_once(runtime_case, gen: Generator) -> None:
    result = run(runtime_case, stdin=b"abx\nxyz\nab\xffc\n")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3
    assert result.stderr.splitlines() == [
        "warning: not valid UTF-8, bytes replaced by U+FFFD: line 3",
        "warning: no symbol of the source vocabulary, output left empty: line 2",
        "warning: symbols outside the source vocabulary, fed as <unk>: 'x' '\ufffd' "
        "(line 1, line 3)",
    ]
    assert result.stdout.splitlines()[1:] == ["", gen.generate(["ab\ufffdc"])[0].text]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--seed", "1", "abc"), "--seed only apply with --sample"),
        (("--n-best", "2", "--beam", "2", "abc"), "--n-best prints its list with --json only"),
        (("--stream", "--beam", "2", "abc"), "--stream works with greedy or sampling"),
        (("--input", "x.txt", "abc"), "give TEXT arguments or --input FILE, not both"),
    ],
)
def test_usage_errors(runtime_case, args: tuple[str, ...], message: str) -> None:
    result = run(runtime_case, *args)
    assert result.exit_code == 2 and message in result.stderr


def test_impossible_options_and_providers_are_edgeseq_errors(runtime_case) -> None:
    result = run(runtime_case, "--sample", "--top-p", "1.5", "abc")
    assert result.exit_code == 1 and "top_p must be in (0, 1]" in str(result.exception)
    argv = ["generate", str(runtime_case.bundle), "--provider", "cuda", "abc"]
    result = CliRunner().invoke(cli, argv)
    if result.exit_code == 0:
        pytest.skip("CUDA works on this machine")
    assert isinstance(result.exception, ProviderError)


def test_help_documents_the_input_rules(runtime_case) -> None:
    result = CliRunner().invoke(cli, ["generate", "--help"])
    for phrase in ("Empty line", "<unk>", "--truncate", "U+FFFD", "--provider"):
        assert phrase in result.stdout


def test_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "edgeseq.cli.main", "generate", str(tmp_path / "nope"), "x"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(
        f"error: {tmp_path / 'nope'} is neither a bundle directory nor a built-in model ("
    )
    assert proc.stderr.endswith("(edgeseq export CHECKPOINT --out DIR)\n")
    assert proc.stderr.count("\n") == 1


def test_usage_errors_exit_2_with_clicks_lines() -> None:
    """Through the console entry point, as docs/runtime.md and the README say: a usage error
    exits 2 with click's `Usage:` and `Error:` lines, not the `error:` line of exit 1."""
    cmd = [sys.executable, "-m", "edgeseq.cli.main", "generate", "g2p-en", "--bogus", "x"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("Usage: edgeseq generate [OPTIONS] BUNDLE")
    assert proc.stderr.endswith("Error: No such option '--bogus'.\n")
