"""The server's request queue: jobs waiting for a batcher, bounded in inputs, refused once
closed. `Batcher` and `continuous.StepBatcher` each consume one.

    queue = BoundedQueue(max_inputs=1024)
    queue.put(job, inputs=3)     # QueueFullError past the limit, ShuttingDownError once closed
    first = queue.pop_oldest()   # waits for a job; None once closed and drained
    more = queue.take(lambda job: ...)    # remove the jobs a predicate accepts, in order
    queue.close()                # refuse new jobs and wake every waiting worker

Tests hold a queue (`hold`, then `release`) to fill it before any worker starts a batch, and
read `waiting` to know a worker is blocked on it; the server does neither.

The limit is a `QueueLimit`: several queues can share one (`use_limit`), so that their jobs
together never hold more than its inputs, however many threads put at once. Each queue
guards its jobs with its own condition variable; the limit has a lock of its own, always
taken inside a queue's (never the other way round), so queues sharing it cannot deadlock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from ..errors import EdgeseqError

JobT = TypeVar("JobT")  # what a batcher queues: batcher.Job, continuous.StepJob


class QueueFullError(EdgeseqError):
    """The batching queue has no room for a request; retry later."""


class ShuttingDownError(EdgeseqError):
    """The server is draining its queue before exit and takes no new requests."""


class QueueLimit:
    """At most `max_inputs` inputs queued, counted over every queue that uses this limit."""

    def __init__(self, max_inputs: int) -> None:
        self.max_inputs = max_inputs
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Inputs counted now."""
        return self._used

    def reserve(self, inputs: int) -> None:
        """Count `inputs` more; QueueFullError (nothing counted) when they would not fit."""
        with self._lock:
            if inputs > self.max_inputs - self._used:
                raise QueueFullError(
                    f"the queue is full ({self._used} inputs waiting, at most "
                    f"{self.max_inputs}); retry later"
                )
            self._used += inputs

    def release(self, inputs: int) -> None:
        """Stop counting `inputs` (they left a queue)."""
        with self._lock:
            self._used -= inputs


class BoundedQueue(Generic[JobT]):
    """Jobs in arrival order, each counted as some inputs against a `QueueLimit`."""

    def __init__(self, limit: int | QueueLimit) -> None:
        """`limit`: the most inputs queued, or a QueueLimit shared with other queues."""
        self._limit = limit if isinstance(limit, QueueLimit) else QueueLimit(limit)
        self._jobs: deque[tuple[JobT, int]] = deque()  # (job, its inputs)
        self._inputs = 0
        self._closed = False
        self._held = False  # see `hold`
        self._waiting = 0  # threads blocked in pop_oldest or wait
        self._cv = threading.Condition()

    @property
    def limit(self) -> QueueLimit:
        """The limit this queue counts its inputs against."""
        return self._limit

    @property
    def queued_inputs(self) -> int:
        """Inputs of the jobs in this queue."""
        return self._inputs

    @property
    def closed(self) -> bool:
        """True once `close` ran: puts are refused, the queued jobs remain to be taken."""
        return self._closed

    @property
    def waiting(self) -> int:
        """Threads now blocked in `pop_oldest` or `wait` (tests wait for a worker to block)."""
        return self._waiting

    def use_limit(self, limit: QueueLimit) -> None:
        """Count this queue's inputs against `limit` from now on (e.g. one shared with
        another queue); only while the queue is empty."""
        with self._cv:
            if self._jobs:
                raise RuntimeError("a queue changes its limit only while it is empty")
            self._limit = limit

    def put(self, job: JobT, inputs: int) -> None:
        """Queue `job` as `inputs` inputs and wake a waiting worker. ShuttingDownError once
        closed; QueueFullError when the limit cannot take `inputs` more."""
        with self._cv:
            if self._closed:
                raise ShuttingDownError("the server is shutting down; send the request elsewhere")
            self._limit.reserve(inputs)
            self._jobs.append((job, inputs))
            self._inputs += inputs
            self._cv.notify_all()

    def close(self) -> None:
        """Refuse further puts and wake every waiting worker (the queued jobs stay)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def hold(self) -> None:
        """Make `pop_oldest` wait, jobs queued or not, until `release` or `close`: a test fills
        the queue before a worker starts a batch (`take` and `wait` are not held)."""
        with self._cv:
            self._held = True

    def release(self) -> None:
        """End `hold` and wake the waiting workers."""
        with self._cv:
            self._held = False
            self._cv.notify_all()

    def pop_oldest(self) -> JobT | None:
        """Wait for a job and remove the oldest; None once closed with nothing queued."""
        with self._cv:
            while (self._held or not self._jobs) and not self._closed:
                self._block(None)
            if not self._jobs:
                return None
            job, inputs = self._jobs.popleft()
            self._forget(inputs)
            return job

    def take(self, pick: Callable[[JobT], bool]) -> list[JobT]:
        """Remove and return, oldest first, the queued jobs `pick` accepts (`pick` is called
        once per job, in queue order, so it may count what it accepted)."""
        with self._cv:
            kept: deque[tuple[JobT, int]] = deque()
            taken = []
            for job, inputs in self._jobs:
                if pick(job):
                    taken.append(job)
                    self._forget(inputs)
                else:
                    kept.append((job, inputs))
            self._jobs = kept
            return taken

    def wait(self, until: float, enough: Callable[[Sequence[JobT]], bool]) -> None:
        """Return once `enough(queued jobs)` holds, the queue is closed, or time.monotonic()
        reaches `until`; `enough` is checked on every put."""
        with self._cv:
            while not self._closed and not enough([job for job, _ in self._jobs]):
                left = until - time.monotonic()
                if left <= 0:
                    return
                self._block(left)

    def _block(self, timeout: float | None) -> None:
        """Wait on the condition, at most `timeout` seconds, counted in `waiting` (lock held)."""
        self._waiting += 1
        try:
            self._cv.wait(timeout)
        finally:
            self._waiting -= 1

    def _forget(self, inputs: int) -> None:
        """Uncount a removed job's inputs (lock held)."""
        self._inputs -= inputs
        self._limit.release(inputs)
