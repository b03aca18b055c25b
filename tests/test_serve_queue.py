"""The server's queue (runtime/serve/queue.py): the input limit, refusal once closed, waking
the workers; one limit for both batchers of step batching, however many threads submit; and
`max_batch_tokens` in step batching."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions
from edgeseq.runtime.serve.batcher import Batcher, BatchSettings
from edgeseq.runtime.serve.continuous import SplitBatcher, StepBatcher, steps_decoder
from edgeseq.runtime.serve.queue import (
    BoundedQueue,
    QueueFullError,
    QueueLimit,
    ShuttingDownError,
)

GREEDY, BEAM = GenerationOptions(), GenerationOptions(beam_size=2)


def test_the_queue_refuses_past_its_limit_and_after_close_then_drains() -> None:
    queue: BoundedQueue[str] = BoundedQueue(3)
    queue.put("a", 2)
    with pytest.raises(QueueFullError, match=r"queue is full \(2 inputs waiting, at most 3\)"):
        queue.put("b", 2)
    queue.put("c", 1)
    assert queue.queued_inputs == 3 and queue.limit.used == 3
    queue.close()
    with pytest.raises(ShuttingDownError, match="shutting down; send the request elsewhere"):
        queue.put("d", 1)
    assert [queue.pop_oldest(), queue.pop_oldest(), queue.pop_oldest()] == ["a", "c", None]
    assert queue.queued_inputs == 0 and queue.limit.used == 0


def test_take_removes_the_jobs_it_accepts_in_order() -> None:
    queue: BoundedQueue[int] = BoundedQueue(100)
    for n in range(6):
        queue.put(n, n)
    room = 6

    def fits(n: int) -> bool:  # counts what it accepted, as the batchers' predicates do
        nonlocal room
        if n > room:
            return False
        room -= n
        return True

    assert queue.take(fits) == [0, 1, 2, 3]
    assert queue.queued_inputs == 4 + 5 and queue.pop_oldest() == 4


def background(target) -> tuple[threading.Thread, list]:
    """Run `target()` on a thread; its return value lands in the list."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(target()), daemon=True)
    thread.start()
    return thread, out


def until_blocked(queue: BoundedQueue, threads: int) -> None:
    """Return once `threads` threads are blocked on `queue` (fail after a minute)."""
    deadline = time.monotonic() + 60
    while queue.waiting < threads:
        assert time.monotonic() < deadline, f"{queue.waiting} of {threads} threads waiting"
        time.sleep(0.001)


# A waiting thread must be woken: a wait until an hour from now that returns within a minute
# (HANG_S) was woken, not timed out.
FAR_S, HANG_S = 3600.0, 60.0


def test_put_and_close_wake_waiting_workers() -> None:
    queue: BoundedQueue[str] = BoundedQueue(10)
    thread, got = background(queue.pop_oldest)
    until_blocked(queue, 1)
    assert got == []  # waiting for work
    queue.put("job", 1)
    thread.join(HANG_S)
    assert got == ["job"]

    far = time.monotonic() + FAR_S
    queue.put("one", 1)
    thread, got = background(lambda: queue.wait(far, lambda jobs: len(jobs) >= 2))
    until_blocked(queue, 1)
    assert got == []  # one job is not enough
    queue.put("two", 1)
    thread.join(HANG_S)
    assert got == [None] and not thread.is_alive()

    empty: BoundedQueue[str] = BoundedQueue(10)
    popper, popped = background(empty.pop_oldest)
    waiter, waited = background(lambda: empty.wait(far, lambda jobs: bool(jobs)))
    until_blocked(empty, 2)
    empty.close()
    popper.join(HANG_S)
    waiter.join(HANG_S)
    assert popped == [None] and waited == [None]
    assert not popper.is_alive() and not waiter.is_alive() and empty.waiting == 0


def test_a_held_queue_gives_no_job_until_released_or_closed() -> None:
    queue: BoundedQueue[str] = BoundedQueue(10)
    queue.hold()
    queue.put("a", 1)
    thread, got = background(queue.pop_oldest)
    until_blocked(queue, 1)
    queue.put("b", 1)  # a put wakes the worker, which waits on while held
    assert got == [] and queue.queued_inputs == 2
    assert queue.take(lambda job: job == "b") == ["b"]  # take is not held
    queue.release()
    thread.join(HANG_S)
    assert got == ["a"]

    queue.put("c", 1)
    queue.hold()
    thread, got = background(queue.pop_oldest)
    until_blocked(queue, 1)
    queue.close()  # closing drains what is queued, held or not
    thread.join(HANG_S)
    assert got == ["c"] and queue.pop_oldest() is None


def test_queues_sharing_a_limit_count_together() -> None:
    shared = QueueLimit(3)
    first: BoundedQueue[str] = BoundedQueue(shared)
    second: BoundedQueue[str] = BoundedQueue(100)
    second.use_limit(shared)
    first.put("a", 2)
    with pytest.raises(QueueFullError, match=r"queue is full \(2 inputs waiting, at most 3\)"):
        second.put("b", 2)
    second.put("c", 1)
    assert shared.used == 3
    with pytest.raises(RuntimeError, match="only while it is empty"):
        first.use_limit(QueueLimit(10))
    assert first.pop_oldest() == "a" and shared.used == 1


class NoBundle:
    """A stand-in generator for batchers that never run: resolves options only."""

    def resolve(self, options: GenerationOptions) -> GenerationOptions:
        return options.filled()


def unstarted_split(settings: BatchSettings) -> SplitBatcher:
    """A SplitBatcher whose workers never start: what is accepted stays queued."""
    return SplitBatcher(Batcher(None, settings), StepBatcher(NoBundle(), None, settings))


def submit_from_threads(split: SplitBatcher, threads: int, each: int) -> tuple[int, int]:
    """`threads` threads submit `each` one-input requests at once (greedy and beam
    alternating, so both queues fill); (accepted, refused)."""
    start = threading.Barrier(threads)
    accepted, refused = [0] * threads, [0] * threads

    def client(n: int) -> None:
        start.wait()
        for i in range(each):
            try:
                split.submit([f"w{n}-{i}"], GREEDY if (n + i) % 2 else BEAM, 60)
                accepted[n] += 1
            except QueueFullError:
                refused[n] += 1

    clients = [threading.Thread(target=client, args=(n,)) for n in range(threads)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(60)
    return sum(accepted), sum(refused)


def test_the_combined_limit_holds_with_many_threads_submitting() -> None:
    """20 rounds of 32 threads x 20 requests against one limit of 100 inputs: every round
    exactly 100 queued and 540 refused. Several rounds, since a race shows in some only (a
    limit checked outside a lock let about half of them queue 101-116)."""
    threads, each, limit = 32, 20, 100
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show
    try:
        outcomes = []
        for _ in range(20):
            split = unstarted_split(BatchSettings(max_queue=limit))
            outcomes.append((*submit_from_threads(split, threads, each), split.queued_inputs))
            assert split.requests.queued_inputs + split.steps.queued_inputs == limit
            assert split.requests.queued_inputs > 0 and split.steps.queued_inputs > 0
    finally:
        sys.setswitchinterval(interval)
    assert set(outcomes) == {(limit, threads * each - limit, limit)}


def test_closing_the_split_batcher_refuses_both_kinds_of_request() -> None:
    split = unstarted_split(BatchSettings(max_queue=10))
    split.submit(["a"], GREEDY, 60)
    split.close(0)
    for options in (GREEDY, BEAM):
        with pytest.raises(ShuttingDownError, match="shutting down"):
            split.submit(["b"], options, 60)


@pytest.fixture(scope="module")
def generator(steps_bundle) -> Generator:
    return Generator.load(steps_bundle, providers="cpu", threads=1)


@pytest.mark.parametrize("budget", [None, 8])
def test_step_batching_keeps_the_tokens_in_flight_within_max_batch_tokens(
    generator, budget
) -> None:
    """Source tokens (with </s>) 4, 4, 12 (3 inputs) and 6: with a budget of 8 the first two
    fly together, the larger request joins an empty batch alone, and the last one (6) fits
    beside none of the others' rows, so it waits for an empty batch too."""
    requests = [["abc"], ["hij"], ["fed", "cab", "gij"], ["dcehg"]]
    tokens = [sum(len(generator.encode(t).ids) for t in texts) for texts in requests]
    assert tokens == [4, 4, 12, 6]
    steps: list[tuple[int, int]] = []  # (rows in the step, rows that joined at it)
    settings = BatchSettings(max_batch=8, max_batch_tokens=budget, max_wait_ms=0)
    batcher = StepBatcher(
        generator,
        steps_decoder(generator, "step"),
        settings,
        lambda rows, joined, _chosen, _seconds: steps.append((rows, joined)),
    )
    futures = [batcher.submit(t, GREEDY, 60, n) for t, n in zip(requests, tokens, strict=True)]
    batcher.start()
    try:
        answers = [future.result(60) for future in futures]
    finally:
        batcher.close()
    joins = [(rows, joined) for rows, joined in steps if joined]
    assert joins == ([(6, 6)] if budget is None else [(2, 2), (3, 3), (1, 1)])
    for texts, got in zip(requests, answers, strict=True):
        want = generator.generate(texts, GREEDY)
        assert [r.token_ids for r in got] == [r.token_ids for r in want]
