"""Dynamic batching across requests: a bounded queue and worker threads that run
`Generator.generate` on merged batches.

    batcher = Batcher(generator, BatchSettings(max_batch=32, max_wait_ms=5))
    batcher.start()
    future = batcher.submit(["hello", "world"], GenerationOptions(), timeout_s=30)
    future.result()            # list[Result], one per text, in order
    batcher.close()            # finishes what is queued, then stops the workers

A worker takes the oldest request and waits at most `max_wait_ms` for more requests with
the same options, counted from that request's arrival or from the moment the worker became
free, whichever is later (so clients answered by the previous batch can join the next one).
It runs them as one call to `Generator.generate` with `batch_size=max_batch`: up to
`max_batch` inputs (and `max_batch_tokens` source tokens, if set). A request with more inputs
than `max_batch` runs alone, split into engine batches by `generate` itself. Requests whose
options differ never share a batch. With fp32 graphs merging does not change the output
tokens (padding is masked, and a seeded sample depends only on its input and the options;
scores can move in the 7th significant digit); with int8 graphs it can (activations are
quantized per tensor over the batch: docs/runtime.md). If a merged batch fails, each
request in it is run again alone, so one bad request cannot fail the others.

The queue (`self.queue`, a `BoundedQueue` of runtime/serve/queue.py) is bounded in inputs:
`submit` raises `QueueFullError` when a request would not fit (the server answers 429) and
`ShuttingDownError` once `close` began. A request still queued after its timeout is dropped
unrun.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from ..errors import EdgeseqError
from ..generator import Generator, Result
from ..search import MAX_HYPOTHESES, GenerationOptions
from .queue import BoundedQueue, QueueFullError, ShuttingDownError

__all__ = [
    "BatchSettings",
    "Batcher",
    "Job",
    "QueueFullError",
    "RequestTimeoutError",
    "ShuttingDownError",
    "options_key",
    "run_merged",
]


class RequestTimeoutError(EdgeseqError, TimeoutError):
    """A request waited in the queue past its timeout and was not run."""


@dataclass(frozen=True)
class BatchSettings:
    """How requests are merged and bounded."""

    max_batch: int = 32  # inputs per engine batch
    max_batch_tokens: int | None = None  # source tokens (with </s>) per merged batch; None: any
    max_wait_ms: float = 5.0  # how long the oldest request waits for others to join it
    max_queue: int = 1024  # inputs waiting at most; more: QueueFullError (HTTP 429)
    workers: int = 1  # threads running the model (each runs one batch at a time)


@dataclass
class Job:
    """One request's inputs waiting for a batch; `future` receives list[Result]."""

    texts: list[str]
    options: GenerationOptions
    tokens: int  # source tokens with </s>, for the token budget
    deadline: float  # time.monotonic() after which it is dropped unrun
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)


def options_key(options: GenerationOptions, max_batch: int) -> GenerationOptions:
    """What must be equal for two requests to share a batch: every option, with the
    engine batch size set to the server's (lowered so that beam_size x batch_size stays
    within MAX_HYPOTHESES)."""
    beams = options.beam_size or 1  # unset: resolved by run_merged
    return replace(options, batch_size=min(max_batch, MAX_HYPOTHESES // beams))


def run_merged(
    generator: Generator,
    requests: Sequence[tuple[Sequence[str], GenerationOptions]],
    max_batch: int,
) -> list[list[Result] | Exception]:
    """Run requests (texts, options), merging those with equal options into one
    `generate` call; per request its results, or the exception that request alone raised.
    Also used by the Ray Serve deployment."""
    groups: dict[GenerationOptions, list[int]] = {}
    for index, (_, options) in enumerate(requests):
        options = generator.resolve(options)  # unset fields: the bundle's defaults
        groups.setdefault(options_key(options, max_batch), []).append(index)
    out: list[list[Result] | Exception] = [[] for _ in requests]
    for options, members in groups.items():
        texts = [t for i in members for t in requests[i][0]]
        try:
            results = generator.generate(texts, options)
        except Exception as exc:
            if len(members) == 1:
                out[members[0]] = exc
                continue
            for i in members:  # find the culprit: each request alone
                out[i] = run_merged(generator, [requests[i]], max_batch)[0]
            continue
        start = 0
        for i in members:
            out[i] = results[start : start + len(requests[i][0])]
            start += len(requests[i][0])
    return out


class Batcher:
    """A bounded queue of requests and the worker threads that run them in batches."""

    def __init__(
        self,
        generator: Generator,
        settings: BatchSettings | None = None,
        on_batch: Callable[[int, int, float], None] | None = None,
    ) -> None:
        """`on_batch(inputs, generated_tokens, seconds)` is called after every engine call."""
        self.generator = generator
        self.settings = settings or BatchSettings()
        self.on_batch = on_batch
        self.queue: BoundedQueue[Job] = BoundedQueue(self.settings.max_queue)
        self._threads: list[threading.Thread] = []

    @property
    def queued_inputs(self) -> int:
        """Inputs waiting for a batch."""
        return self.queue.queued_inputs

    def start(self) -> None:
        """Start the worker threads."""
        for n in range(self.settings.workers):
            thread = threading.Thread(target=self._work, name=f"edgeseq-batcher-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(
        self, texts: list[str], options: GenerationOptions, timeout_s: float, tokens: int = 0
    ) -> Future:
        """Queue a request; its future gets list[Result] (one per text) or an exception.
        Raises QueueFullError when the queue cannot take `len(texts)` more inputs. Unset
        options take the bundle's defaults when the batch runs (`run_merged`)."""
        job = Job(list(texts), options, tokens, time.monotonic() + timeout_s)
        self.queue.put(job, len(texts))
        return job.future

    def close(self, timeout_s: float | None = None) -> None:
        """Stop taking requests, run every queued one, and join the workers."""
        self.queue.close()
        for thread in self._threads:
            thread.join(timeout_s)

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(batch)

    def _next_batch(self) -> list[Job] | None:
        """The oldest job and the compatible ones that fit its batch (waiting up to
        max_wait_ms for them), without those cancelled or past their deadline meanwhile;
        None once closing with nothing left."""
        settings = self.settings
        free = time.monotonic()  # when this worker became free to run a batch
        first = self.queue.pop_oldest()
        if first is None:
            return None
        key = options_key(first.options, settings.max_batch)
        rows, tokens = len(first.texts), first.tokens
        until = max(first.arrived, free) + settings.max_wait_ms / 1000

        def fits(job: Job) -> bool:
            budget = settings.max_batch_tokens
            return (
                options_key(job.options, settings.max_batch) == key
                and rows + len(job.texts) <= settings.max_batch
                and (budget is None or tokens + job.tokens <= budget)
            )

        def joins(job: Job) -> bool:
            nonlocal rows, tokens
            if not fits(job):
                return False
            rows, tokens = rows + len(job.texts), tokens + job.tokens
            return True

        batch = [first]
        while True:
            batch += self.queue.take(joins)
            if rows >= settings.max_batch or self.queue.closed or time.monotonic() >= until:
                break
            self.queue.wait(until, lambda jobs: any(fits(job) for job in jobs))
        return [job for job in batch if self._start(job)]

    @staticmethod
    def _start(job: Job) -> bool:
        """Mark `job` running; False (and its future settled) if it was cancelled or its
        deadline passed."""
        if not job.future.set_running_or_notify_cancel():
            return False
        if time.monotonic() > job.deadline:
            job.future.set_exception(RequestTimeoutError("timed out waiting in the queue"))
            return False
        return True

    def _run(self, batch: list[Job]) -> None:
        if not batch:
            return
        started = time.perf_counter()
        outcomes = run_merged(
            self.generator, [(job.texts, job.options) for job in batch], self.settings.max_batch
        )
        seconds = time.perf_counter() - started
        generated = sum(
            len(r.token_ids) + r.finished
            for outcome in outcomes
            if not isinstance(outcome, Exception)
            for r in outcome
        )
        # Metrics first: a client that has its answer then finds the batch counted.
        if self.on_batch is not None:
            self.on_batch(sum(len(job.texts) for job in batch), generated, seconds)
        for job, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, Exception):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)
