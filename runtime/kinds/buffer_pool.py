"""Float32 buffers reused from one generation to the next.

    pool = BufferPool()
    lease = Lease(pool)                    # held by every decoder state of one generation
    cache = lease.take((rows, heads, length, d_head))
    del lease                              # the last state gone: its buffers go back

The in-place cache (runtime/kinds/in_place.py) keeps megabytes of preallocated buffers per
batch. Fresh memory costs a page fault per 4 KiB on its first write (about 10 µs each in
the virtual machines measured), more than decoding a step of a small model, so a buffer
comes from the pool when one is large enough. A buffer's contents are whatever its last
user left: callers write every position before they read it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

POOL_BYTES = 256 * 2**20  # free buffers kept, at most; larger returns are dropped


class BufferPool:
    """Flat float32 arrays free for reuse, behind a lock (generations may run in threads)."""

    def __init__(self, limit_bytes: int = POOL_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    @property
    def free_bytes(self) -> int:
        """Bytes of the buffers waiting for reuse."""
        with self._lock:
            return sum(a.nbytes for a in self._free)

    def take(self, shape: Sequence[int]) -> np.ndarray:
        """A float32 array of `shape`, a view of the smallest free buffer that holds it, or of
        a new one; its contents are undefined."""
        size = int(np.prod(shape))
        with self._lock:
            fits = [i for i, a in enumerate(self._free) if a.size >= size]
            flat = self._free.pop(min(fits, key=lambda i: self._free[i].size)) if fits else None
        if flat is None:
            flat = np.empty(size, np.float32)
        return flat[:size].reshape(shape)

    def give(self, flats: Sequence[np.ndarray]) -> None:
        """Return flat buffers (from `take`'s views' `.base`); kept while under the limit."""
        with self._lock:
            held = sum(a.nbytes for a in self._free)
            for flat in sorted(flats, key=lambda a: a.nbytes):
                if held + flat.nbytes <= self.limit_bytes:
                    self._free.append(flat)
                    held += flat.nbytes


class Lease:
    """The buffers one generation took from a pool, given back when the lease is collected
    (the decoder states that share it are all gone)."""

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self._flats: list[np.ndarray] = []

    def take(self, shape: Sequence[int]) -> np.ndarray:
        """`BufferPool.take`, remembered for the return."""
        array = self.pool.take(shape)
        self._flats.append(array.base if array.base is not None else array)
        return array

    def __del__(self) -> None:
        self.pool.give(self._flats)
