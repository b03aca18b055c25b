"""The one atomic directory writer: all or nothing, and no temporaries left behind, even by a
process that was killed mid-write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeseq.runtime.atomic import atomic_directory, remove_stale_temporaries


def _dead_pid() -> int:
    """The id of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_success_replaces_the_target_and_leaves_no_sibling(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_directory(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".bundle.tmp-")
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_failure_keeps_the_target_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="half way"), atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("half way")
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_a_killed_writers_temporaries_are_removed_by_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    dead = _dead_pid()
    stale = tmp_path / f".bundle.tmp-{dead}-0a1b2c3d"
    stale.mkdir()
    (stale / "encoder.onnx").write_bytes(b"half")
    set_aside = tmp_path / f".bundle.old-{dead}-00ff00ff"
    set_aside.mkdir()
    live = tmp_path / f".bundle.tmp-{os.getpid()}-deadbeef"  # a writer still running
    live.mkdir()
    other = tmp_path / f".other.tmp-{dead}-12345678"  # another target's: not ours to clean
    other.mkdir()
    with atomic_directory(target) as tmp:
        (tmp / "x").write_text("x")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["bundle", live.name, other.name])
    assert remove_stale_temporaries(target) == []
