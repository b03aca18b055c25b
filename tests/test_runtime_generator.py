"""Generator API: generate, n-best, batching, streaming, sampling, threads (issue 4)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from edgeseq.runtime.errors import InputTooLongError, OptionsError
from edgeseq.runtime.generator import Generator, Result
from edgeseq.runtime.search import GenerationOptions, search

TEXTS = ["abc", "j", "hgfedcba", "aaaaaaaaaaaaaaaaaaa", "bad", "cafebabe", "", "abcdefghij"]


@pytest.fixture(scope="module")
def gen(runtime_case) -> Generator:
    return Generator.load(runtime_case.bundle, providers="cpu", threads=1)


def test_generate_equals_the_search_on_the_step_model(gen: Generator) -> None:
    results = gen.generate(TEXTS)
    assert all(isinstance(r, Result) for r in results) and len(results) == len(TEXTS)
    tok = gen.tokenizers.source
    for text, result in zip(TEXTS, results, strict=True):
        if not text:  # no symbol: not run (tests/test_hostile_input.py)
            assert result.skipped == "empty" and result.text == "" and result.nbest == ()
            continue
        src = np.array([[*tok.encode(text), tok.eos_id]], dtype=np.int64)
        [[hyp]] = search(gen.step_model, src, GenerationOptions())
        assert result.token_ids == hyp.tokens and result.score == pytest.approx(hyp.score)
        assert result.text == gen.tokenizers.target.decode(hyp.tokens)
        assert result.nbest[0].text == result.text and len(result.nbest) == 1
    assert results[0].text == "CBA"  # the trained model reverses short inputs


def test_batch_size_does_not_change_results(gen: Generator) -> None:
    one = gen.generate(TEXTS, GenerationOptions(batch_size=1))
    many = gen.generate(TEXTS, GenerationOptions(batch_size=3))
    assert [r.token_ids for r in one] == [r.token_ids for r in many]


def test_beam_gives_an_nbest_list(gen: Generator) -> None:
    results = gen.generate(TEXTS[:3], GenerationOptions(beam_size=4, n_best=3))
    for r in results:
        assert len(r.nbest) == 3 and r.nbest[0].token_ids == r.token_ids
        assert [c.score for c in r.nbest] == sorted((c.score for c in r.nbest), reverse=True)
        assert len({c.token_ids for c in r.nbest}) == 3


def test_sampling_is_reproducible_per_input(gen: Generator) -> None:
    options = GenerationOptions(sample=True, seed=7, temperature=2.0)
    first = gen.generate(TEXTS, options)
    assert gen.generate(TEXTS, options) == first
    assert gen.generate(TEXTS[::-1], options) == first[::-1], "must not depend on batch order"
    assert gen.generate([TEXTS[2]], options)[0] == first[2]
    other = gen.generate(TEXTS, GenerationOptions(sample=True, seed=8, temperature=2.0))
    assert [r.token_ids for r in other] != [r.token_ids for r in first]


@pytest.mark.parametrize(
    "options",
    [
        GenerationOptions(),
        GenerationOptions(sample=True, seed=3, temperature=1.5),
        GenerationOptions(max_new_tokens=3),
    ],
)
def test_stream_pieces_join_to_the_generated_text(gen: Generator, options) -> None:
    for text in ("abc", "hgfedcba", "jihgfedcba"):
        pieces = list(gen.stream(text, options))
        assert "".join(pieces) == gen.generate([text], options)[0].text
        assert all(pieces)


def test_stream_refuses_beam_and_over_long_inputs_at_the_call(gen: Generator) -> None:
    with pytest.raises(OptionsError, match="beam search cannot do"):
        gen.stream("abc", GenerationOptions(beam_size=2))
    with pytest.raises(InputTooLongError, match="max_len is 20"):
        gen.stream("a" * 20)


def test_over_long_inputs_raise_or_are_truncated(gen: Generator) -> None:
    with pytest.raises(InputTooLongError, match="input 1: input has 26 source tokens with </s>"):
        gen.generate(["abc", "a" * 25])
    result = gen.generate(["a" * 25], GenerationOptions(truncate=True))[0]
    assert result.source.truncated and len(result.source.ids) == 20
    assert result.source.ids[-1] == gen.config.eos_id
    assert not gen.generate(["a" * 19])[0].source.truncated  # 19 + </s> fits exactly


def test_unknown_symbols_are_recorded(gen: Generator) -> None:
    result = gen.generate(["abxyc"])[0]
    assert result.source.unknown == ("x", "y")
    assert result.source.ids.count(gen.tokenizers.source.unk_id) == 2


def test_a_single_string_is_refused(gen: Generator) -> None:
    with pytest.raises(OptionsError, match="takes a list of texts"):
        gen.generate("abc")  # type: ignore[arg-type]


def test_concurrent_generate_equals_sequential(gen: Generator) -> None:
    jobs = [
        (TEXTS, GenerationOptions()),
        (TEXTS, GenerationOptions(beam_size=3, n_best=2)),
        (TEXTS, GenerationOptions(sample=True, seed=1)),
        (TEXTS[::-1], GenerationOptions(batch_size=2)),
    ] * 2
    sequential = [gen.generate(texts, options) for texts, options in jobs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(gen.generate, texts, options) for texts, options in jobs]
        concurrent = [f.result() for f in futures]
    assert concurrent == sequential


class _NeverEnds:
    """A step model that can never emit `</s>`: every output runs to the step budget."""

    def __init__(self, inner) -> None:
        self.inner = inner
        for name in ("max_len", "vocab_size", "bos_id", "eos_id", "pad_id"):
            setattr(self, name, getattr(inner, name))

    def start(self, src_ids):
        return self.inner.start(src_ids)

    def step(self, state, input_ids):
        logits, state = self.inner.step(state, input_ids)
        logits = logits.copy()
        logits[..., self.eos_id] = -np.inf
        return logits, state

    def select(self, state, rows):
        return self.inner.select(state, rows)


def test_scoring_texts_equal_generator_texts_even_for_outputs_that_never_end(gen) -> None:
    """metrics.generate_texts (what `edgeseq evaluate` scores) decodes with the Generator's
    default budget, so an unfinished output is cut at the same length in both paths."""
    from edgeseq.runtime.metrics import generate_texts

    for model in (gen.step_model, _NeverEnds(gen.step_model)):
        scored = generate_texts(model, TEXTS[:-2], gen.tokenizers, batch_size=3)
        tok = gen.tokenizers.source
        for text, got in zip(TEXTS[:-2], scored, strict=True):
            src = np.array([[*tok.encode(text), tok.eos_id]], dtype=np.int64)
            [[hyp]] = search(model, src, GenerationOptions())
            assert got == gen.tokenizers.target.decode(hyp.tokens), text
