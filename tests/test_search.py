"""Search algorithms (runtime/search.py) against independent naive references.

The fake numpy model tests the search alone; the PyTorch model tests it against the model's
own uncached forward. ORT-vs-PyTorch parity lives in test_runtime_parity.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from naive_reference import (
    FakeStep,
    full_prefix_logprobs,
    naive_beam,
    naive_greedy,
    torch_logprobs,
)

from edgeseq.runtime.errors import InputTooLongError, OptionsError
from edgeseq.runtime.search import (
    GenerationOptions,
    beam_search,
    greedy_search,
    sample_token,
    search,
)


def padded(rows: list[list[int]], pad: int = 0) -> np.ndarray:
    out = np.full((len(rows), max(map(len, rows))), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def fake_sources(n: int = 6, seed: int = 4) -> list[list[int]]:
    """Variable-length sources of ids 4..8, each ending with </s> (2)."""
    rng = np.random.default_rng(seed)
    return [[*rng.integers(4, 9, rng.integers(1, 8)).tolist(), 2] for _ in range(n)]


# -- options -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_p": 0.0, "sample": True}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5, "sample": True}, r"top_p must be in \(0, 1\]"),
        ({"beam_size": 4, "sample": True}, "sampling and beam search exclude each other"),
        ({"temperature": 0.0, "sample": True}, "temperature must be a finite number > 0"),
        ({"temperature": float("inf"), "sample": True}, "temperature must be a finite number"),
        ({"temperature": float("nan"), "sample": True}, "temperature must be a finite number"),
        ({"length_penalty": float("nan")}, "length_penalty must be a finite number"),
        ({"top_k": -1, "sample": True}, "top_k must be an integer >= 0"),
        ({"beam_size": 0}, "beam_size must be a positive integer"),
        ({"beam_size": 2, "n_best": 3}, r"n_best \(3\) cannot exceed beam_size \(2\)"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"seed": 3}, "seed only apply with sample=True"),
        ({"top_k": 5, "temperature": 0.5}, "temperature, top_k only apply with sample=True"),
    ],
)
def test_impossible_options_are_refused_up_front(kwargs: dict, message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        GenerationOptions(**kwargs)


def test_options_collect_every_problem_and_are_frozen() -> None:
    with pytest.raises(OptionsError, match=r"beam_size.*top_p"):
        GenerationOptions(beam_size=0, top_p=2.0, sample=True)
    options = GenerationOptions()
    with pytest.raises(AttributeError):
        options.beam_size = 3  # type: ignore[misc]
    assert options.method == "greedy"
    assert GenerationOptions(beam_size=2).method == "beam"
    assert GenerationOptions(sample=True).method == "sample"


# -- greedy and beam on the fake model --------------------------------------------------------
def test_greedy_equals_naive_full_redecode_and_rows_leave_the_batch() -> None:
    model = FakeStep()
    sources = fake_sources()
    got = greedy_search(model, padded(sources), max_new_tokens=20)
    for src, tokens in zip(sources, got, strict=True):
        expected, _ = naive_greedy(full_prefix_logprobs(FakeStep(), src, 1), 2, model.max_len)
        assert tokens == expected
    lengths = sorted({len(t) for t in got})
    assert len(lengths) > 2, "the fake sources should finish at different steps"
    assert model.batch_sizes[0] == len(sources)
    assert model.batch_sizes == sorted(model.batch_sizes, reverse=True)
    assert model.batch_sizes[-1] < len(sources), "finished rows must leave the batch"
    assert len(model.batch_sizes) == min(max(len(t) for t in got) + 1, model.max_len)


def test_max_new_tokens_and_max_len_bound_the_output() -> None:
    sources = fake_sources()
    for tokens in greedy_search(FakeStep(), padded(sources), max_new_tokens=2):
        assert len(tokens) <= 2
    model = FakeStep(max_len=4)  # </s> becomes likely only after 4 tokens
    hyps = search(model, padded([[4, 5, 6, 2]]), GenerationOptions(beam_size=2, n_best=2))
    assert [len(h.tokens) for h in hyps[0]] == [4, 4]
    assert not any(h.finished for h in hyps[0])


def test_source_longer_than_max_len_is_refused() -> None:
    with pytest.raises(
        InputTooLongError, match="source has 13 tokens but the model's max_len is 12"
    ):
        greedy_search(FakeStep(), np.full((1, 13), 4, dtype=np.int64), max_new_tokens=5)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_equals_naive_beam_per_input(length_penalty: float) -> None:
    sources = fake_sources(5, seed=3)
    got = beam_search(FakeStep(), padded(sources), 3, None, length_penalty, n_best=3)
    for src, hyps in zip(sources, got, strict=True):
        ref = naive_beam(full_prefix_logprobs(FakeStep(), src, 1), 2, 3, 12, length_penalty)
        assert [h.tokens for h in hyps] == [r[0] for r in ref[:3]]
        np.testing.assert_allclose([h.score for h in hyps], [r[2] for r in ref[:3]], rtol=1e-9)
        assert [h.finished for h in hyps] == [r[3] for r in ref[:3]]


def test_beam_one_is_greedy_tokens_and_scores() -> None:
    sources = padded(fake_sources(8, seed=5))
    greedy = search(FakeStep(), sources, GenerationOptions())
    beam = beam_search(FakeStep(), sources, 1)
    assert [g[0] for g in greedy] == [b[0] for b in beam]


def test_wide_beam_finds_the_exhaustive_optimum() -> None:
    """With a beam wider than the search space, the best hypothesis is the best sequence."""
    model = FakeStep(vocab_size=6, max_len=4)  # real tokens 4, 5 (+ </s>)
    src = [4, 5, 2]
    logprobs = full_prefix_logprobs(FakeStep(vocab_size=6, max_len=4), src, 1)
    best, best_score = None, -np.inf
    for length in range(0, 5):
        for tokens in itertools.product((4, 5), repeat=length):
            ends = length < 4
            total = sum(logprobs(tokens[:i])[t] for i, t in enumerate(tokens))
            total += logprobs(tokens)[2] if ends else 0.0
            if total > best_score:
                best, best_score = tokens, total
    [hyps] = beam_search(model, padded([src]), beam_size=64, length_penalty=0.0)
    assert hyps[0].tokens == best
    assert hyps[0].score == pytest.approx(best_score)


def test_nbest_is_sorted_and_distinct() -> None:
    [hyps] = search(FakeStep(), padded([[4, 6, 7, 2]]), GenerationOptions(beam_size=5, n_best=5))
    assert len(hyps) == 5
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    assert len({h.tokens for h in hyps}) == 5


# -- sampling ----------------------------------------------------------------------------------
def test_sampling_with_a_seed_repeats_and_seeds_differ() -> None:
    sources = padded(fake_sources(6, seed=7))
    options = GenerationOptions(sample=True, seed=11, temperature=2.0)
    first = search(FakeStep(), sources, options)
    assert search(FakeStep(), sources, options) == first
    other = search(FakeStep(), sources, GenerationOptions(sample=True, seed=12, temperature=2.0))
    assert other != first


def test_a_rows_sample_does_not_depend_on_the_other_rows() -> None:
    sources = fake_sources(6, seed=7)
    rngs = lambda: [np.random.default_rng([5, i]) for i in range(6)]  # noqa: E731
    options = GenerationOptions(sample=True, seed=5, temperature=2.0)
    together = search(FakeStep(), padded(sources), options, rngs())
    alone = search(FakeStep(), padded([sources[3]]), options, [rngs()[3]])
    assert alone[0] == together[3]


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    sources = padded(fake_sources(6, seed=9))
    greedy = greedy_search(FakeStep(), sources, 20)
    for options in (
        GenerationOptions(sample=True, seed=1, top_k=1),
        GenerationOptions(sample=True, seed=1, top_p=1e-9),
    ):
        assert [list(h[0].tokens) for h in search(FakeStep(), sources, options)] == greedy


def test_sample_token_follows_top_k_and_top_p() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(0)
    draws = [sample_token(logits, rng, 1.0, 2, 1.0) for _ in range(2000)]
    assert set(draws) == {0, 1}
    assert np.mean(np.array(draws) == 0) == pytest.approx(0.5 / 0.8, abs=0.04)
    draws = [sample_token(logits, rng, 1.0, 0, 0.85) for _ in range(2000)]
    assert set(draws) == {0, 1, 2}  # 0.5 + 0.3 < 0.85 <= 0.95
    draws = [sample_token(logits, rng, 1.0, 0, 1.0) for _ in range(4000)]
    assert np.bincount(draws, minlength=4) / 4000 == pytest.approx([0.5, 0.3, 0.15, 0.05], abs=0.03)


# -- the same search on PyTorch vs the model's own uncached forward ----------------------------
def test_torch_greedy_equals_naive_uncached_decode(runtime_model, one_torch_thread) -> None:
    from edgeseq.build_model.torch_step import TorchStep

    model, tok = runtime_model.model, runtime_model.tokenizers.source
    texts = ["abc", "j", "hgfedcba", "aaaaaaaaaaaaaaaaaaa"]  # the last fills max_len (20)
    sources = [[*tok.encode(t), tok.eos_id] for t in texts]
    batch = greedy_search(TorchStep(model), padded(sources), 50)
    for src, tokens in zip(sources, batch, strict=True):
        expected, _ = naive_greedy(torch_logprobs(model, src), model.cfg.eos_id, model.cfg.max_len)
        assert tokens == expected
        assert greedy_search(TorchStep(model), padded([src]), 50) == [expected]


def test_torch_beam_equals_naive_beam(runtime_model, one_torch_thread) -> None:
    from edgeseq.build_model.torch_step import TorchStep

    model, tok = runtime_model.model, runtime_model.tokenizers.source
    sources = [[*tok.encode(t), tok.eos_id] for t in ("bad", "jihgfedcba", "c")]
    got = beam_search(TorchStep(model), padded(sources), 4, n_best=4)
    for src, hyps in zip(sources, got, strict=True):
        ref = naive_beam(torch_logprobs(model, src), model.cfg.eos_id, 4, model.cfg.max_len)
        assert [h.tokens for h in hyps] == [r[0] for r in ref[:4]]
        np.testing.assert_allclose([h.score for h in hyps], [r[2] for r in ref[:4]], atol=1e-5)


def test_top_indices_is_a_stable_descending_argsort() -> None:
    from edgeseq.runtime.ranking import top_indices

    rng = np.random.default_rng(0)
    for trial in range(500):
        n, k = int(rng.integers(1, 60)), int(rng.integers(1, 10))
        values = rng.integers(-5, 5, n).astype(float) if trial % 2 else rng.normal(size=n)
        if trial % 7 == 0:
            values[rng.integers(0, n, 3)] = -np.inf  # ties at -inf, as masked logits give
        want = np.argsort(-values, kind="stable")[:k]
        assert top_indices(values, k).tolist() == want.tolist(), (values, k)


def test_ranking_every_input_at_once_equals_input_by_input() -> None:
    """`ranked` over a beam step (all inputs with the same number of rows: one vectorised
    ranking; uneven groups, ties at the k-th place, too few candidates: input by input)
    gives each input exactly `top_indices` of its rows' candidates."""
    from edgeseq.runtime.ranking import ranked, ranked_groups, top_indices

    rng = np.random.default_rng(1)
    vectorised = 0
    for trial in range(300):
        group, vocab = int(rng.integers(1, 5)), int(rng.integers(1, 12))
        sizes = [group] * int(rng.integers(1, 6))
        if trial % 5 == 0:
            sizes[-1] = max(1, group - 1)  # uneven groups
        row_input = [i for i, size in enumerate(sizes) for _ in range(size)]
        shape = (len(row_input), vocab)
        candidates = rng.integers(-4, 2, shape) if trial % 3 == 0 else rng.normal(size=shape)
        candidates = candidates.astype(float)
        k = int(rng.integers(1, 9))
        got = list(ranked(candidates, row_input, k))
        starts = [row_input.index(i) for i in range(len(sizes))]
        assert [start for start, _, _ in got] == starts
        for (start, top, values), size in zip(got, sizes, strict=True):
            flat = candidates[start : start + size].ravel()
            assert top == top_indices(flat, k).tolist()
            assert values == flat[top].tolist()
        even = len(set(sizes)) == 1
        vectorised += even and ranked_groups(candidates, group, k) is not None
    assert vectorised > 50  # the vectorised path is exercised
