"""Hand the heap's free pages back to the operating system between the export's phases.

    release_free_heap()      # after a parity group: its decodes' buffers are free again

A parity group decodes hundreds of rows against a large vocabulary: numpy, PyTorch and
onnxruntime allocate and free many buffers of a few MB each, which glibc serves from its
heap and keeps after they are freed. The next phase (the source model's weights, a variant's
sessions) then sits on top of memory that nothing uses: on the NLLB-200-600M shape, level 3
alone left 2.5 GB of it. `malloc_trim` returns it; elsewhere (musl, macOS, Windows) this is
a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _malloc_trim() -> object | None:
    """glibc's malloc_trim, None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


def release_free_heap() -> None:
    """Return the free pages of the C heap to the operating system (glibc; else nothing)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)  # type: ignore[operator]
