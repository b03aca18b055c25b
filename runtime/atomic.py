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
directory) raises `OutputPathError` before anything is written; `check_writable` runs the
same checks up front, before slow work such as an export.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from .errors import OutputPathError

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


def _why(target: Path, exc: OSError) -> str:
    """The reason `target` cannot be created, with what to do."""
    for parent in target.parents:
        if parent.exists() and not parent.is_dir():
            return f"{parent} is a file, not a directory; choose another path"
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EROFS):
        return f"{exc.strerror} in {target.parent}; choose a directory you can write to"
    return f"{exc.strerror or exc}; choose another path"


def _sibling(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def check_writable(target: str | Path) -> None:
    """Raise OutputPathError unless `atomic_directory(target)` could write there: its parent
    can be created and holds a new directory. Leaves only the created parent behind."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe = _sibling(target, "tmp")
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise OutputPathError(f"cannot write {target}: {_why(target, exc)}") from None


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces `target` when the block succeeds
    and is deleted when it raises (see the module docstring)."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        tmp = _sibling(target, "tmp")
        tmp.mkdir()  # honours the umask, unlike tempfile.mkdtemp's 0700
    except OSError as exc:
        raise OutputPathError(f"cannot write {target}: {_why(target, exc)}") from None
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
