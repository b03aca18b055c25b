"""The same search on onnxruntime and on PyTorch gives the same tokens (issue 4).

Engines are compared, not copies of the search: `search` drives `OrtStep` (numpy state),
`OrtBoundStep` (IO binding, here on the CPU device) and `TorchStep` alike; greedy is also
checked against the model's own uncached forward (a full re-decode every step).
"""

from __future__ import annotations

import numpy as np
import pytest
from naive_reference import naive_greedy, torch_logprobs

from edgeseq.runtime import constants as C
from edgeseq.runtime.kinds.seq2seq import OrtBoundStep, OrtStep
from edgeseq.runtime.providers import CPU_EP, session_options
from edgeseq.runtime.search import GenerationOptions, beam_search, greedy_search, search

TEXTS = ["abc", "j", "hgfedcba", "aaaaaaaaaaaaaaaaaaa", "bad", "cafebabe", "ji", "abcdefghij"]


def padded(rows: list[list[int]], pad: int = 0) -> np.ndarray:
    out = np.full((len(rows), max(map(len, rows))), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


@pytest.fixture(scope="module")
def engines(runtime_case):
    """(torch step, numpy ORT step, IO-binding ORT step on CPU, source id lists)."""
    import onnxruntime as ort

    from edgeseq.build_model.torch_step import TorchStep

    cfg = runtime_case.model.cfg
    options = session_options(threads=1)
    sessions = [
        ort.InferenceSession(str(runtime_case.bundle / name), options, providers=[CPU_EP])
        for name in (C.ENCODER_FILE, C.DECODER_FILE)
    ]
    tok = runtime_case.tokenizers.source
    sources = [[*tok.encode(t), tok.eos_id] for t in TEXTS]
    return (
        TorchStep(runtime_case.model),
        OrtStep(*sessions, cfg),
        OrtBoundStep(*sessions, cfg, device_type="cpu"),
        sources,
    )


def dev_sources(runtime_case, n: int = 100, seed: int = 42) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    tok = runtime_case.tokenizers.source
    texts = ["".join(rng.choice(list("abcdefghij"), rng.integers(1, 12))) for _ in range(n)]
    return [[*tok.encode(t), tok.eos_id] for t in texts]


def test_ort_greedy_equals_torch_and_the_uncached_decode(
    engines, runtime_case, one_torch_thread
) -> None:
    torch_step, ort_step, _, sources = engines
    model = runtime_case.model
    batch = greedy_search(ort_step, padded(sources), 50)
    assert batch == greedy_search(torch_step, padded(sources), 50)
    assert len({len(t) for t in batch}) > 3, "outputs should finish at different steps"
    for src, tokens in zip(sources, batch, strict=True):
        naive, _ = naive_greedy(torch_logprobs(model, src), model.cfg.eos_id, model.cfg.max_len)
        assert tokens == naive
        assert greedy_search(ort_step, padded([src]), 50) == [naive]


@pytest.mark.parametrize("batched", [False, True])
def test_ort_beam_equals_torch_beam(engines, batched: bool, one_torch_thread) -> None:
    torch_step, ort_step, _, sources = engines
    groups = [sources] if batched else [[s] for s in sources]
    for group in groups:
        got = beam_search(ort_step, padded(group), 4, n_best=4)
        want = beam_search(torch_step, padded(group), 4, n_best=4)
        for g, w in zip(got, want, strict=True):
            assert [h.tokens for h in g] == [h.tokens for h in w]
            np.testing.assert_allclose([h.score for h in g], [h.score for h in w], atol=1e-4)


def test_beam_one_equals_greedy_on_ort(engines) -> None:
    _, ort_step, _, sources = engines
    greedy = search(ort_step, padded(sources), GenerationOptions())
    assert beam_search(ort_step, padded(sources), 1) == greedy


def test_io_binding_step_equals_numpy_step(engines) -> None:
    _, ort_step, bound_step, sources = engines
    src = padded(sources)
    for options in (GenerationOptions(), GenerationOptions(beam_size=3, n_best=3)):
        assert search(bound_step, src, options) == search(ort_step, src, options)
    state = bound_step.start(src)
    assert (state.batch, state.past_len) == (len(sources), 0)
    logits, state = bound_step.step(state, np.full((len(sources), 2), 1, dtype=np.int64))
    assert logits.shape == (len(sources), 2, ort_step.vocab_size)
    assert state.past_len == 2 and bound_step.select(state, np.array([2, 2])).batch == 2
    fresh = bound_step.select(bound_step.start(src), np.array([1, 1, 0]))  # empty host cache
    logits, fresh = bound_step.step(fresh, np.full((3, 1), 1, dtype=np.int64))
    want, _ = ort_step.step(ort_step.select(ort_step.start(src), np.array([1, 1, 0])), [[1]] * 3)
    np.testing.assert_array_equal(logits, want)


def test_seeded_sampling_equals_torch(engines, one_torch_thread) -> None:
    torch_step, ort_step, _, sources = engines
    options = GenerationOptions(sample=True, seed=3, temperature=1.5, top_p=0.95)
    got = search(ort_step, padded(sources), options)
    want = search(torch_step, padded(sources), options)
    assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
    np.testing.assert_allclose([h[0].logprob for h in got], [h[0].logprob for h in want], atol=1e-4)


def test_dev_set_greedy_and_beam4_match_torch_100_percent(
    engines, runtime_case, one_torch_thread
) -> None:
    torch_step, ort_step, _, _ = engines
    sources = dev_sources(runtime_case)
    for start in range(0, len(sources), 25):
        src = padded(sources[start : start + 25])
        assert greedy_search(ort_step, src, 50) == greedy_search(torch_step, src, 50)
        got = [h[0].tokens for h in beam_search(ort_step, src, 4)]
        assert got == [h[0].tokens for h in beam_search(torch_step, src, 4)]
