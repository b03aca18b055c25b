"""Float32 buffers reused from one generation to the next, and a bound on the generations
that hold buffers at once.

    pool = BufferPool(limit_bytes=512 * 2**20, generations=2)
    lease = Lease(pool)                  # one generation's claim: waits while 2 others hold one
    cache = lease.take((rows, heads, length, d_head))   # a view of a pooled buffer
    lease.give((cache,))                 # replaced: its buffer goes back to the pool now
    lease.close()                        # (or the lease collected) the rest go back, slot freed

The in-place cache (runtime/kinds/in_place.py) keeps megabytes to gigabytes of preallocated
buffers per batch. Fresh memory costs a page fault per 4 KiB on its first write (about 10 µs
each in the virtual machines measured), more than decoding a step of a small model, so a
buffer comes from the pool when one of its size class is free. A buffer's contents are
whatever its last user left: callers write every position before they read it.

Size classes: a request of n floats is served by a buffer of the class 2**ceil(log2 n) floats
(a buffer at most twice the request, never a larger class, never a smaller one), so a class
holds buffers of one capacity and any of them fits any request of the class. Buffers of
`MAPPED_BYTES` or more are anonymous memory maps of their own (where the platform has them):
pages a request never touches (the tail of the class) are never resident, and a dropped
buffer's memory goes back to the system at once instead of staying in the heap.

The cap: free buffers are kept up to `limit_bytes`; past it, the buffers of the class used
least recently (taken or given back) are dropped first, so the classes the current batches
use stay and those of earlier, different batches go. A request that finds its class empty
first drops free buffers the same way until the free bytes plus its new buffer fit the cap
(a server whose batch sizes vary does not hold stale classes beside new ones).

Generations: a `Lease` holds one of `generations` slots from its creation until it is closed
(or collected), and a new lease waits for a free slot; a thread that already holds a slot
(a caller stepping two generations in turn) shares it instead of waiting on itself. While
waiting, the garbage collector runs every `WAIT_COLLECT_S` seconds, so a lease kept alive only
by a reference cycle (an exception's traceback stored by its handler) cannot block the others.
"""

from __future__ import annotations

import gc
import mmap
import threading
from collections.abc import Iterable, Sequence

import numpy as np

POOL_BYTES = 256 * 2**20  # free buffers kept, at most, when the owner names no cap
GENERATIONS = 2  # generations holding buffers at once, at most, when the owner names none
WAIT_COLLECT_S = 1.0  # a waiting lease runs the garbage collector this often
MAPPED_BYTES = 2**20  # buffers this large are memory maps of their own (see above)
_PRIVATE = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)


def size_class(size: int) -> int:
    """The class of a request of `size` floats: c with 2**(c - 1) < size <= 2**c."""
    return max(int(size) - 1, 0).bit_length()


def new_buffer(size: int) -> np.ndarray:
    """A flat float32 array (size,), contents undefined: a private anonymous memory map when
    it is `MAPPED_BYTES` or more and the platform has them, else numpy's allocation."""
    if size * 4 < MAPPED_BYTES or None in _PRIVATE:
        return np.empty(size, np.float32)
    pages = mmap.mmap(-1, size * 4, flags=_PRIVATE[0] | _PRIVATE[1])
    return np.frombuffer(pages, np.float32)


def address(array: np.ndarray) -> int:
    """Where `array`'s data starts (a prefix view starts where its buffer does)."""
    return array.__array_interface__["data"][0]


class GenerationSlots:
    """At most `limit` threads hold a slot at once; a thread's slot is shared by the leases
    it holds and freed with the last of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[int, int] = {}  # owner thread ident -> its leases alive
        self._cond = threading.Condition(threading.RLock())  # re-entered by finalizers
        self.waiting = 0  # threads waiting for a slot now

    @property
    def holders(self) -> int:
        """Threads holding a slot now."""
        with self._cond:
            return len(self._held)

    def acquire(self) -> int:
        """Wait for a slot (none when this thread holds one); returns the owner to release."""
        owner = threading.get_ident()
        while True:
            with self._cond:
                if owner in self._held or len(self._held) < self.limit:
                    self._held[owner] = self._held.get(owner, 0) + 1
                    return owner
                self.waiting += 1
                try:
                    if self._cond.wait(WAIT_COLLECT_S):
                        continue
                finally:
                    self.waiting -= 1
            gc.collect()  # outside the lock: collected leases release their slots

    def release(self, owner: int) -> None:
        """One lease of `owner` is done; its slot frees with its last lease."""
        with self._cond:
            left = self._held.get(owner, 0) - 1
            if left > 0:
                self._held[owner] = left
            else:
                self._held.pop(owner, None)
                self._cond.notify_all()


class BufferPool:
    """Flat float32 arrays free for reuse by size class, behind a lock (generations may run
    in threads), and the slots of the generations that hold its buffers."""

    def __init__(self, limit_bytes: int = POOL_BYTES, generations: int = GENERATIONS) -> None:
        self.limit_bytes = limit_bytes
        self.slots = GenerationSlots(generations)
        self._free: dict[int, list[np.ndarray]] = {}  # class -> buffers, most recent last
        self._used: dict[int, int] = {}  # class -> tick of its last take or give
        self._tick = 0
        self._lock = threading.RLock()  # re-entered when a finalizer gives back under it

    @property
    def free_bytes(self) -> int:
        """Bytes of the buffers waiting for reuse."""
        with self._lock:
            return sum(a.nbytes for arrays in self._free.values() for a in arrays)

    def free_classes(self) -> dict[int, int]:
        """Buffers waiting for reuse per size class."""
        with self._lock:
            return {c: len(arrays) for c, arrays in sorted(self._free.items()) if arrays}

    def _touch(self, cls: int) -> None:
        self._tick += 1
        self._used[cls] = self._tick

    def take_flat(self, size: int) -> np.ndarray:
        """A flat float32 buffer of `size_class(size)`'s capacity: a free one of the class, or
        a new one (free buffers of other classes dropped first to keep the cap)."""
        cls = size_class(size)
        with self._lock:
            self._touch(cls)
            free = self._free.get(cls)
            if free:
                return free.pop()
            self._drop_to(self.limit_bytes - 2**cls * 4)
        return new_buffer(2**cls)

    def take(self, shape: Sequence[int]) -> np.ndarray:
        """A float32 array of `shape`, a view of `take_flat`'s buffer; contents undefined."""
        size = int(np.prod(shape))
        return self.take_flat(size)[:size].reshape(shape)

    def give(self, flats: Iterable[np.ndarray]) -> None:
        """Return flat float32 buffers (from `take_flat`); the classes used least recently
        are dropped while the free bytes exceed the cap."""
        with self._lock:
            for flat in flats:
                if flat.dtype != np.float32 or flat.ndim != 1 or not flat.size:
                    continue
                cls = flat.size.bit_length() - 1  # serves requests up to 2**cls <= size
                self._free.setdefault(cls, []).append(flat)
                self._touch(cls)
            self._drop_to(self.limit_bytes)

    def _drop_to(self, limit: int) -> None:
        """Drop free buffers, the oldest of the least recently used class first, until their
        bytes are at most `limit` (under the lock)."""
        held = sum(a.nbytes for arrays in self._free.values() for a in arrays)
        while held > max(limit, 0):
            stalest = min((c for c, a in self._free.items() if a), key=self._used.__getitem__)
            held -= self._free[stalest].pop(0).nbytes

    def drop(self) -> None:
        """Forget every free buffer (their memory goes back when no view is left)."""
        with self._lock:
            self._free.clear()


class Lease:
    """One generation's claim on a pool: a generation slot (waited for here) and the buffers
    it took. `give` returns replaced buffers at once; `close` (also run when the lease is
    collected, i.e. the last decoder state holding it is gone) returns the rest and frees the
    slot."""

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self._flats: dict[int, np.ndarray] = {}  # address -> buffer taken, not given back
        self._owner: int | None = pool.slots.acquire()

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers this lease holds."""
        return sum(a.nbytes for a in self._flats.values())

    def take(self, shape: Sequence[int], dtype: type = np.float32) -> np.ndarray:
        """`BufferPool.take`, remembered for the return; a `dtype` other than float32 (the
        float16 cache of an fp16 bundle) is a view of a float32 buffer of as many bytes."""
        if self._owner is None:
            raise ValueError("this lease is closed: its generation has ended")
        size = int(np.prod(shape))
        itemsize = np.dtype(dtype).itemsize
        flat = self.pool.take_flat(-(-size * itemsize // 4))  # float32s holding the bytes
        self._flats[address(flat)] = flat
        return flat.view(dtype)[:size].reshape(shape)

    def give(self, arrays: Iterable[np.ndarray]) -> None:
        """Return the buffers of `arrays` (views from `take`) to the pool now. The caller
        guarantees that nothing reads or writes them afterwards. Arrays this lease did not
        hand out (or already returned) are ignored."""
        flats = [self._flats.pop(address(a), None) for a in arrays]
        self.pool.give(flat for flat in flats if flat is not None)

    def close(self) -> None:
        """Return every buffer still held and free the slot (once; later calls do nothing)."""
        owner, self._owner = self._owner, None
        if owner is None:
            return
        flats, self._flats = list(self._flats.values()), {}
        try:
            self.pool.give(flats)
        finally:
            self.pool.slots.release(owner)

    def __del__(self) -> None:
        if getattr(self, "_owner", None) is not None:
            self.close()
