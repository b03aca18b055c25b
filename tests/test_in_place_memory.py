"""Bounded memory of the in-place cache decoder (issue 44): the buffer pool's size classes and
least-recently-used eviction, its cap from the model or $EDGESEQ_CACHE_POOL_MB, buffers given
back as soon as a state replaces them (and the states-are-used-once rule that makes it safe),
the bound on generations holding buffers (threads wait, failures release), and the error at
the cache's end. Beam outputs stay those of the copying step model."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time

import numpy as np
import pytest

from edgeseq.runtime import Generator
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import CacheFullError, InputTooLongError, OptionsError
from edgeseq.runtime.kinds import in_place as in_place_module
from edgeseq.runtime.kinds.buffer_pool import (
    MAPPED_BYTES,
    BufferPool,
    Lease,
    address,
    new_buffer,
    size_class,
)
from edgeseq.runtime.kinds.in_place import InPlaceStep, default_pool_bytes, pool_settings
from edgeseq.runtime.search import GenerationOptions, search, token_search

TEXTS = ["abc", "jihgfedcba", "a", "bbbbbbbbbb", "cafe", "decade", "hij", "ab", "gggg", "fab"]
BEAM = GenerationOptions(beam_size=3, n_best=3)
JOIN_S = 120  # a thread still alive after this long is deadlocked (a guard, not a timing)


# -- the pool -----------------------------------------------------------------------------------
def test_size_classes_are_powers_of_two_of_the_flat_size() -> None:
    assert [size_class(n) for n in (1, 2, 3, 4, 5, 1024, 1025)] == [0, 1, 2, 2, 3, 10, 11]
    pool = BufferPool()
    assert pool.take_flat(300).size == 512
    assert pool.take((3, 100)).shape == (3, 100)


def test_take_reuses_a_buffer_of_the_same_class_only() -> None:
    pool = BufferPool(limit_bytes=2**20)
    big = pool.take_flat(1024)  # class 10
    pool.give([big])
    tiny = pool.take((3,))  # class 2: never the 4 KiB buffer
    assert address(tiny) != address(big) and pool.free_classes() == {10: 1}
    again = pool.take((600,))  # class 10 again: the same memory
    assert address(again) == address(big) and again.shape == (600,)
    assert pool.free_bytes == 0


def test_eviction_drops_the_least_recently_used_classes_not_the_largest() -> None:
    """Over the cap, stale small buffers go before recent large ones, and a stale large one
    goes before a recent small one (the old pool kept the smallest)."""
    pool = BufferPool(limit_bytes=2 * 1024 * 4)  # two 1024-float buffers
    pool.give([pool.take_flat(16)])  # class 4, used first
    pool.give([pool.take_flat(1024), pool.take_flat(1024)])  # class 10, used last
    assert pool.free_classes() == {10: 2}

    pool = BufferPool(limit_bytes=2048 * 4 + 16 * 4)
    stale = pool.take_flat(2048)
    fresh = pool.take_flat(16)
    pool.give([stale])
    pool.give([fresh, pool.take_flat(16)])  # class 4 used last: the 2048-float buffer goes
    assert pool.free_classes() == {4: 2}


def test_a_request_of_an_empty_class_drops_stale_buffers_to_keep_the_cap() -> None:
    pool = BufferPool(limit_bytes=2 * 1024 * 4)
    pool.give([pool.take_flat(1024), pool.take_flat(1024)])  # the cap, all in class 10
    pool.take_flat(1024)  # a hit drops nothing
    assert pool.free_classes() == {10: 1}
    pool.take_flat(2048)  # a miss: the new 8 KiB and the free ones must fit the cap
    assert pool.free_bytes == 0


def test_a_cap_of_zero_keeps_nothing_and_a_buffer_over_the_cap_is_dropped() -> None:
    pool = BufferPool(limit_bytes=0)
    pool.give([pool.take_flat(10)])
    assert pool.free_bytes == 0
    pool = BufferPool(limit_bytes=100)
    pool.give([pool.take_flat(1000)])
    assert pool.free_bytes == 0


def test_large_buffers_are_memory_maps_of_their_own() -> None:
    """A mapped buffer's untouched pages are never resident and its memory leaves with it;
    small ones come from numpy."""
    large, small = new_buffer(MAPPED_BYTES // 4), new_buffer(16)
    assert small.flags.owndata
    assert large.flags.writeable and large.size == MAPPED_BYTES // 4
    if os.name == "posix":
        assert not large.flags.owndata  # the map owns the memory
    large[:] = 1.0
    assert float(large.sum()) == MAPPED_BYTES // 4


def test_lease_gives_back_replaced_buffers_at_once_and_the_rest_when_closed() -> None:
    pool = BufferPool(limit_bytes=2**20)
    lease = Lease(pool)
    first, second = lease.take((4, 8)), lease.take((100,))
    lease.give([first, np.zeros(32, np.float32)])  # a foreign array is ignored
    assert pool.free_bytes == 32 * 4 and lease.held_bytes == 128 * 4
    lease.give([first])  # already given back: ignored
    assert pool.free_bytes == 32 * 4
    assert pool.slots.holders == 1
    lease.close()
    lease.close()  # once
    assert pool.free_bytes == (32 + 128) * 4 and pool.slots.holders == 0
    with pytest.raises(ValueError, match="closed"):
        lease.take((1,))
    del second


def test_a_collected_lease_gives_its_buffers_back() -> None:
    pool = BufferPool(limit_bytes=2**20)
    lease = Lease(pool)
    lease.take((2, 5, 10))
    del lease
    assert pool.free_bytes == 128 * 4 and pool.slots.holders == 0


# -- the cap and the generation bound: from the model or the environment --------------------
def test_default_cap_is_a_batch_32_beam_4_cache_at_max_len() -> None:
    config = ModelConfig(100, 100, d_model=512, n_heads=8, n_decoder_layers=6, max_len=512)
    assert default_pool_bytes(config) == 2 * 6 * (128 * 8 * 512 * 64) * 4  # 1.5 GiB
    assert pool_settings(config, {}) == (default_pool_bytes(config), 2)
    assert pool_settings(config, {"EDGESEQ_CACHE_POOL_MB": "0"}) == (0, 2)
    env = {"EDGESEQ_CACHE_POOL_MB": "300", "EDGESEQ_CACHE_GENERATIONS": "4"}
    assert pool_settings(config, env) == (300 * 2**20, 4)


@pytest.mark.parametrize(
    ("name", "value"),
    [("EDGESEQ_CACHE_POOL_MB", "lots"), ("EDGESEQ_CACHE_POOL_MB", "-1"),
     ("EDGESEQ_CACHE_GENERATIONS", "0")],
)  # fmt: skip
def test_bad_settings_are_refused_with_what_to_do(name, value) -> None:
    with pytest.raises(OptionsError, match=f"{name} must be an integer .*unset it"):
        pool_settings(ModelConfig(100, 100), {name: value})


# -- the step model -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loaded(in_place_bundle):
    """(generator, its copying step model, a maker of InPlaceSteps on the in-place decoder)."""
    gen = Generator.load(in_place_bundle, threads=1, search="loop")
    ref, decoder = gen.step_model, gen.in_place.decoder

    def make(**kwargs) -> InPlaceStep:
        return InPlaceStep(ref.encoder, decoder, gen.bundle.config, **kwargs)

    return gen, ref, make


def _src(gen, texts=TEXTS):
    return gen._padded([gen.encode(t) for t in texts])


def test_the_environment_sets_the_step_models_pool(loaded, monkeypatch) -> None:
    gen, _, make = loaded
    assert make().pool.limit_bytes == default_pool_bytes(gen.bundle.config)
    monkeypatch.setenv("EDGESEQ_CACHE_POOL_MB", "7")
    monkeypatch.setenv("EDGESEQ_CACHE_GENERATIONS", "3")
    step = make()
    assert step.pool.limit_bytes == 7 * 2**20 and step.pool.slots.limit == 3
    assert make(pool_bytes=0, generations=1).pool.limit_bytes == 0


def test_grown_buffers_go_back_to_the_pool_during_the_generation(loaded, monkeypatch) -> None:
    """A cache that grows gives its shorter buffers back at once (free bytes grow while the
    generation runs); the state it replaced is spent; a gather into new buffers does too."""
    monkeypatch.setattr(in_place_module, "MIN_CACHE_LEN", 2)
    gen, ref, make = loaded
    step = make()
    src = _src(gen, ["a", "ab", "abc", "cafe"])  # 5 positions: buffers of 10, then 20 (max_len)
    state = step.start(src)
    ids = np.full((4, 1), ref.bos_id, np.int64)
    length = state.cache_len  # 2 x the source length
    while state.past < length:
        _, state = step.step(state, ids)
    assert step.pool.free_bytes == 0
    before, held = state, state.lease.held_bytes
    _, state = step.step(state, ids)  # the buffers grow to twice the length
    assert state.cache_len == 2 * length
    assert step.pool.free_bytes == held  # the old ones, given back
    assert state.lease.held_bytes == 2 * held  # only the new ones held
    with pytest.raises(ValueError, match="used once"):
        step.step(before, ids)
    free = step.pool.free_bytes
    state = step.select(state, np.array([0, 0, 1, 1, 2, 2, 3, 3]))  # gathered into new ones
    assert step.pool.free_bytes > free
    buffers = state.cache_k + state.cache_v  # 8 rows now: only these are held
    assert state.lease.held_bytes == len(buffers) * 2 ** size_class(buffers[0].size) * 4
    with pytest.raises(ValueError, match="used once"):
        step.select(before, np.array([0]))


@pytest.mark.parametrize("min_cache_len", [64, 2])
def test_beam_outputs_are_those_of_the_copying_step_model(loaded, monkeypatch, min_cache_len):
    """Identical fp32 hypotheses with buffers replaced, given back and reused mid-generation
    (a pool of 0 bytes, the default, and one call after another on the same pool)."""
    monkeypatch.setattr(in_place_module, "MIN_CACHE_LEN", min_cache_len)
    gen, ref, make = loaded
    src = _src(gen)
    want = search(ref, src, BEAM)
    for step in (make(pool_bytes=0), make()):
        for _ in range(2):
            got = search(step, src, BEAM)
            for a, b in zip(got, want, strict=True):
                assert [h.tokens for h in a] == [h.tokens for h in b]
                assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-4)
        assert step.pool.slots.holders == 0


def test_a_step_at_max_len_raises_and_releases_the_generation(loaded) -> None:
    gen, ref, make = loaded
    step = make()
    step.max_len = step.max_positions = 3  # buffers of 3 positions
    state = step.start(_src(gen, ["abc"]))
    ids = np.full((1, 1), ref.bos_id, np.int64)
    for _ in range(3):
        _, state = step.step(state, ids)
    with pytest.raises(CacheFullError, match=r"max_len of 3 positions.*at most 3 tokens"):
        step.step(state, ids)
    assert issubclass(CacheFullError, InputTooLongError)
    assert step.pool.slots.holders == 0 and step.pool.free_bytes > 0 and state.spent


# -- generations at once: threads ---------------------------------------------------------------
def _run_threads(targets) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "deadlocked"


def test_a_third_generation_waits_until_one_of_two_ends(loaded) -> None:
    gen, _, make = loaded
    step, src = make(generations=2), _src(gen, TEXTS[:2])
    events: list[str] = []
    started = [threading.Event() for _ in range(2)]
    finish = [threading.Event() for _ in range(2)]

    def holder(i: int) -> None:
        state = step.start(src)
        started[i].set()
        finish[i].wait(JOIN_S)
        events.append(f"end {i}")
        del state  # the generation's last state: its slot frees

    def third() -> None:
        state = step.start(src)
        events.append("third started")
        del state

    holders = [threading.Thread(target=holder, args=(i,)) for i in range(2)]
    for thread in holders:
        thread.start()
    for event in started:
        assert event.wait(JOIN_S)
    waiter = threading.Thread(target=third)
    waiter.start()
    while step.pool.slots.waiting == 0 and waiter.is_alive():  # until it blocks for a slot
        time.sleep(0.01)
    assert events == [] and step.pool.slots.holders == 2
    finish[0].set()
    waiter.join(JOIN_S)
    assert events == ["end 0", "third started"]
    finish[1].set()
    for thread in holders:
        thread.join(JOIN_S)
    assert step.pool.slots.holders == 0


def test_many_threads_never_hold_more_than_the_bound_and_agree(loaded) -> None:
    gen, ref, make = loaded
    step, src = make(generations=2), _src(gen, TEXTS[:4])
    want = [[h.tokens for h in hyps] for hyps in search(ref, src, BEAM)]
    slots, seen, results = step.pool.slots, [], []
    acquire = slots.acquire

    def counting() -> int:
        owner = acquire()
        seen.append(slots.holders)
        return owner

    slots.acquire = counting

    def generation() -> None:
        for _ in range(3):
            results.append([[h.tokens for h in hyps] for hyps in search(step, src, BEAM)])

    _run_threads([generation] * 6)
    assert len(seen) == 18 and max(seen) <= 2 and slots.holders == 0
    assert all(r == want for r in results)


def test_failed_generations_release_their_slot(loaded) -> None:
    """A step that fails (cache end), a search that fails between steps, and a failure whose
    stored exception keeps its state in a reference cycle: the next generation still runs."""
    gen, ref, make = loaded
    step, src = make(generations=1), _src(gen, TEXTS[:3])
    ids = np.full((3, 1), ref.bos_id, np.int64)

    def at_cache_end() -> None:
        step.max_len = step.max_positions = 1
        state = step.start(src)
        _, state = step.step(state, ids)
        try:
            step.step(state, ids)
        except CacheFullError as error:
            kept.append(error)  # kept: the slot was released by the step itself
        step.max_len, step.max_positions = ref.max_len, ref.max_positions

    def choose_fails(logits, rows):
        raise RuntimeError("chooser failed")

    def between_steps() -> None:
        with contextlib.suppress(RuntimeError):
            token_search(step, src, None, choose_fails)

    def in_a_cycle() -> None:
        try:
            token_search(step, src, None, choose_fails)
        except RuntimeError as error:
            failure = error  # the frame holds its own traceback: only gc frees the state
            assert failure

    kept: list[Exception] = []
    done: list[int] = []
    for failing in (at_cache_end, between_steps, in_a_cycle):
        _run_threads([failing])
        _run_threads([lambda: done.append(len(search(step, src, BEAM)))])
    assert done == [3, 3, 3]
    gc.collect()  # the cycle's state, if no waiting lease collected it already
    assert kept and step.pool.slots.holders == 0
