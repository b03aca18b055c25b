"""The batching queue of `edgeseq serve` without HTTP: which requests share an engine call,
the bounds, and that one failing request does not fail the others."""

from __future__ import annotations

import pytest
from serve_client import assert_same_results

from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions
from edgeseq.runtime.serve.batcher import (
    Batcher,
    BatchSettings,
    QueueFullError,
    ShuttingDownError,
    run_merged,
)

GREEDY, BEAM = GenerationOptions(), GenerationOptions(beam_size=2)


@pytest.fixture(scope="module")
def generator(runtime_case) -> Generator:
    return Generator.load(runtime_case.bundle, providers="cpu", threads=1)


def run_queued(
    generator: Generator, jobs: list[tuple[list[str], GenerationOptions, int]], **settings
) -> tuple[list[int], list]:
    """Queue every job before the worker starts; (inputs per engine call, results per job)."""
    calls: list[int] = []
    batcher = Batcher(generator, BatchSettings(**settings), lambda n, _t, _s: calls.append(n))
    futures = [batcher.submit(texts, opts, 60, tokens) for texts, opts, tokens in jobs]
    batcher.start()
    results = [f.result(60) for f in futures]
    batcher.close()
    return calls, results


def test_only_requests_with_equal_options_share_a_batch(generator) -> None:
    jobs = [(["abc"], GREEDY, 4), (["cafe", "b"], BEAM, 7), (["hij", "ab"], GREEDY, 7),
            (["dcba"], BEAM, 5), (["j"], GREEDY, 2)]  # fmt: skip
    calls, results = run_queued(generator, jobs, max_wait_ms=0)
    assert calls == [4, 3]  # the greedy ones, then the beam ones
    for (texts, options, _), got in zip(jobs, results, strict=True):
        assert_same_results(got, generator.generate(texts, options))


def test_row_and_token_budgets_bound_a_batch(generator) -> None:
    jobs = [([w], GREEDY, len(w) + 1) for w in ["abc", "ab", "abcd", "a", "abcdefg"]]
    assert run_queued(generator, jobs, max_batch=2, max_wait_ms=0)[0] == [2, 2, 1]
    # token budget 8: abc+ab (7), abcd+a (7), abcdefg (8)
    assert run_queued(generator, jobs, max_batch_tokens=8, max_wait_ms=0)[0] == [2, 2, 1]
    # a request larger than max_batch still runs, alone
    big = [(["a", "b", "c"], GREEDY, 6), (["d"], GREEDY, 2)]
    assert run_queued(generator, big, max_batch=2, max_wait_ms=0)[0] == [3, 1]


def test_the_queue_is_bounded_and_closing_refuses_new_requests(generator) -> None:
    batcher = Batcher(generator, BatchSettings(max_queue=3))
    batcher.submit(["a", "b"], GREEDY, 60)
    with pytest.raises(QueueFullError, match=r"queue is full \(2 inputs waiting, at most 3\)"):
        batcher.submit(["c", "d"], GREEDY, 60)
    last = batcher.submit(["c"], GREEDY, 60)
    batcher.start()
    batcher.close()
    assert len(last.result(0)) == 1  # queued before close: run
    with pytest.raises(ShuttingDownError, match="shutting down"):
        batcher.submit(["e"], GREEDY, 60)


class Failing:
    """A stand-in generator whose generate fails on any batch holding "boom"."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def resolve(self, options: GenerationOptions) -> GenerationOptions:
        return options.filled()  # no bundle: edgeseq's defaults

    def generate(self, texts: list[str], options: GenerationOptions) -> list[str]:
        self.calls.append(list(texts))
        if "boom" in texts:
            raise ValueError("boom")
        return [t.upper() for t in texts]


def test_a_failing_request_is_isolated_from_its_batch_mates() -> None:
    stub = Failing()
    requests = [(["a", "b"], GREEDY), (["boom"], GREEDY), (["c"], GREEDY), (["d"], BEAM)]
    out = run_merged(stub, requests, max_batch=32)
    assert out[0] == ["A", "B"] and out[2] == ["C"] and out[3] == ["D"]
    assert isinstance(out[1], ValueError)
    assert stub.calls[0] == ["a", "b", "boom", "c"]  # merged first, then one by one
