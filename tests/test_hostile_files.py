"""Files and processes fail cleanly (issue 24, class 7): one `error:` line on stderr, exit
status 1, no traceback; a closed output pipe ends a command quietly; stale temporaries of a
killed writer are cleaned by the next write to the same place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeseq.runtime.atomic import check_writable, remove_stale_temporaries
from edgeseq.runtime.errors import DataError, PathError

SHIPPED_CHECKPOINT = Path(__file__).resolve().parents[1] / "models" / "g2p-en"
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def edgeseq(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `edgeseq ARGS` as a user would (the console entry point, in a new process)."""
    command = [sys.executable, "-m", "edgeseq.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300)


def assert_one_error_line(result: subprocess.CompletedProcess, match: str) -> None:
    """Exit 1, nothing but one `error: ...` line containing `match` on stderr."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert match in lines[0], lines[0]


# -- generate --input ---------------------------------------------------------------------------
def test_generate_input_missing_or_a_directory(tmp_path: Path) -> None:
    missing = edgeseq("generate", "g2p-en", "--threads", "1", "--input", str(tmp_path / "no.txt"))
    assert_one_error_line(missing, "No such file or directory")
    directory = edgeseq("generate", "g2p-en", "--threads", "1", "--input", str(tmp_path))
    assert_one_error_line(directory, "is a directory; pass a file of input lines")


@pytest.mark.skipif(AS_ROOT, reason="root reads files whatever their permissions")
def test_generate_input_unreadable(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hello\n")
    secret.chmod(0)
    result = edgeseq("generate", "g2p-en", "--threads", "1", "--input", str(secret))
    assert_one_error_line(result, "Permission denied")


# -- export --out ---------------------------------------------------------------------------------
def test_export_out_below_a_regular_file_fails_before_loading(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory\n")
    out = tmp_path / "afile" / "sub" / "bundle"
    result = edgeseq("export", str(SHIPPED_CHECKPOINT), "--out", str(out), "--no-verify")
    assert_one_error_line(result, f"{tmp_path / 'afile'} is a file, not a directory")
    assert result.stdout == ""  # refused before the checkpoint was even loaded


def test_check_writable_names_the_blocking_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(PathError, match=r"afile is a file, not a directory; choose another"):
        check_writable(tmp_path / "afile" / "x")
    check_writable(tmp_path / "new" / "bundle")  # creatable: passes, leaves only the parent
    assert list((tmp_path / "new").iterdir()) == []


def test_train_out_below_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    corpus = tmp_path / "pairs.tsv"
    words = [a + b + c for a in "abcdef" for b in "abcdef" for c in "abcdef"]
    corpus.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    recipe = Path(__file__).resolve().parents[1] / "models" / "recipes" / "tiny.json"
    result = edgeseq(
        "train", "--task", "tsv", "--data", str(corpus), "--recipe", str(recipe),
        "--out", str(tmp_path / "afile" / "run"), "--threads", "1", "--quiet",
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    progress, error = result.stderr.strip().splitlines()  # "task tsv: 192 train, ..." first
    assert progress.startswith("task tsv: ")
    assert error.startswith("error: cannot write ") and error.endswith(
        "afile is a file, not a directory; choose another output path"
    )


@pytest.mark.skipif(AS_ROOT, reason="root writes into read-only directories")
def test_export_out_in_a_read_only_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(PathError, match=r"locked is not writable .*choose another output"):
            check_writable(locked / "bundle")
        result = edgeseq("export", str(SHIPPED_CHECKPOINT), "--out", str(locked / "b"))
        assert_one_error_line(result, "is not writable")
    finally:
        locked.chmod(0o755)


# -- training corpora -----------------------------------------------------------------------------
def test_a_corpus_that_is_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    from edgeseq.build_model.tasks import read_tsv

    corpus = tmp_path / "latin1.tsv"
    corpus.write_bytes("abc\tABC\r\n\nd\u00e9j\u00e0\tDEJA\n".encode("latin-1"))
    with pytest.raises(DataError, match=rf"{corpus}:3: not valid UTF-8 \(byte 0xe9 at column 2"):
        read_tsv(corpus)
    with pytest.raises(DataError, match="is a directory"):
        read_tsv(tmp_path)


def test_train_on_a_corpus_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.tsv"
    corpus.write_bytes(b"ab\tAB\n\xff\xfe\tCD\n")
    recipe = Path(__file__).resolve().parents[1] / "models" / "recipes" / "tiny.json"
    result = edgeseq(
        "train", "--task", "tsv", "--data", str(corpus), "--recipe", str(recipe),
        "--out", str(tmp_path / "run"), "--threads", "1",
    )  # fmt: skip
    assert_one_error_line(result, f"{corpus}:2: not valid UTF-8")


# -- a closed output pipe -------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["generate", "inspect"])
def test_a_closed_output_pipe_ends_quietly(command: str, tmp_path: Path) -> None:
    words = tmp_path / "words.txt"
    words.write_text("ab\n" * 6000)
    args = {"generate": ["--threads", "1", "--input", str(words)], "inspect": []}[command]
    process = subprocess.Popen(
        [sys.executable, "-m", "edgeseq.cli.main", command, "g2p-en", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout.readline()  # the reader takes one line, then goes away (| head -1)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    status = process.wait(timeout=300)
    assert status in (0, 141), stderr
    assert stderr == ""  # no "Exception ignored ... BrokenPipeError", no traceback


# -- stale temporaries ----------------------------------------------------------------------------
def test_stale_temporaries_of_a_killed_unreaped_writer_are_removed(tmp_path: Path) -> None:
    """A writer killed with SIGKILL whose parent has not reaped it yet is a zombie: its pid
    still exists, but its temporary directory is stale all the same."""
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    writer.kill()
    try:
        while Path(f"/proc/{writer.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            pass  # killed, not yet a zombie
        stale = tmp_path / f".bundle.tmp-{writer.pid}-0a1b2c3d"
        (stale / "sub").mkdir(parents=True)
        assert remove_stale_temporaries(tmp_path / "bundle") == [stale]
        assert not stale.exists()
    finally:
        writer.wait()


def test_checkpoint_writes_clean_stale_temporaries(tmp_path: Path) -> None:
    from edgeseq.build_model.checkpoint import save_checkpoint
    from edgeseq.build_model.model import Seq2SeqTransformer
    from edgeseq.runtime.config import ModelConfig
    from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

    chars = Tokenizer.train_char(["abc"])
    cfg = ModelConfig(
        src_vocab_size=chars.vocab_size, tgt_vocab_size=chars.vocab_size, d_model=8, n_heads=2,
        n_encoder_layers=1, n_decoder_layers=1, d_ff=8, max_len=8,
    )  # fmt: skip
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f".ckpt.tmp-{int(dead.stdout)}-deadbeef"
    stale.mkdir()
    task = {"name": "copy", "options": {}}
    save_checkpoint(
        tmp_path / "ckpt", Seq2SeqTransformer(cfg), TokenizerPair(chars, chars), task, {}
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
