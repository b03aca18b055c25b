"""Write a directory all at once: the one way edgeseq puts a bundle or a checkpoint in place.

    with atomic_directory("bundles/rev") as tmp:   # an empty hidden sibling of the target
        write_everything_into(tmp)
    # now bundles/rev is the new directory; on an exception nothing changed

The block writes into `.NAME.tmp-PID-XXXX` next to the target. When it succeeds that
directory replaces the target (whatever was there is moved aside, then deleted); when it
raises (an error, a failed check, Ctrl-C) the temporary directory is deleted. A process
killed mid-write leaves its temporary directory behind: the next write to the same target
deletes every such sibling whose process is gone (or is a zombie).

A target that cannot be written (below a regular file, in a read-only or unwritable
directory) raises `PathError` before anything is written; `check_writable` runs the same
checks up front, before slow work such as an export.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from .errors import PathError

_TEMP = re.compile(r"\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)-[0-9a-f]+")


def _alive(pid: int) -> bool:
    """Whether a process with this id runs (ours counts; a zombie, killed but not yet reaped
    by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # the process just ended, or no /proc (macOS): then os.kill's answer stands
        return not Path("/proc").is_dir()
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _make_parent(target: Path) -> None:
    """Create `target`'s parent directories, or raise PathError saying why they cannot be."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise PathError(
                f"cannot write {target}: {blocker} is a file, not a directory; "
                "choose another output path"
            ) from None
        raise PathError(
            f"cannot create {target.parent}: {exc.strerror or exc}; choose a writable output path"
        ) from None


def _make_temporary(target: Path) -> Path:
    """Create and return an empty temporary sibling of `target` (PathError if impossible)."""
    tmp = _sibling(target, "tmp")
    try:
        tmp.mkdir()  # honours the umask, unlike tempfile.mkdtemp's 0700
    except OSError as exc:
        raise PathError(
            f"cannot write {target}: {target.parent} is not writable ({exc.strerror or exc}); "
            "choose another output path or make that directory writable"
        ) from None
    return tmp


def check_writable(target: str | Path) -> None:
    """Raise PathError unless `atomic_directory(target)` could write there: its parent can be
    created and holds a new directory. Nothing is left behind."""
    target = Path(target)
    _make_parent(target)
    _make_temporary(target).rmdir()


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Delete `target`'s temporary and set-aside siblings left by processes that are gone;
    return what was deleted."""
    removed = []
    if not target.parent.is_dir():
        return removed
    for sibling in target.parent.iterdir():
        match = _TEMP.fullmatch(sibling.name)
        if match and match["name"] == target.name and not _alive(int(match["pid"])):
            _remove(sibling)
            removed.append(sibling)
    return removed


def _remove(path: Path) -> None:
    """Delete a file, a link or a directory tree, whichever `path` is."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _sibling(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces `target` when the block succeeds
    and is deleted when it raises (see the module docstring)."""
    target = Path(target)
    _make_parent(target)
    remove_stale_temporaries(target)
    tmp = _make_temporary(target)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    old = None
    if target.exists() or target.is_symlink():
        old = _sibling(target, "old")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        _remove(old)
