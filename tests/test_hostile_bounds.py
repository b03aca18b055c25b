"""Resource bounds (issue 24, class 8): what can exhaust memory is bounded with a message
naming the limit, a wide beam splits the batch instead of failing, and every float option is
a finite number (API, CLI and the HTTP request schema alike)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgeseq.runtime import generator as generator_module
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import MAX_BEAM_SIZE, MAX_LIVE_HYPOTHESES, GenerationOptions
from edgeseq.runtime.serve.request import Limits, RequestError, parse_generate


def test_a_huge_beam_is_refused_naming_the_limit() -> None:
    with pytest.raises(OptionsError, match=r"beam_size 10000 is above the limit of 64.*smaller"):
        GenerationOptions(beam_size=10000)
    assert GenerationOptions(beam_size=MAX_BEAM_SIZE, n_best=MAX_BEAM_SIZE).beam_size == 64


def test_the_cli_refuses_a_huge_beam_in_one_line() -> None:
    command = [sys.executable, "-m", "edgeseq.cli.main", "generate", "g2p-en", "--beam", "10000"]
    result = subprocess.run([*command, "hello"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "beam_size 10000 is above the limit of 64" in result.stderr


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            dict(beam_size=4, length_penalty=1e300),
            r"length_penalty must be .*got 1e\+300; use one in \[-10, 10\]",
        ),
        (
            dict(beam_size=4, length_penalty=-50.0),
            r"length_penalty must be .*got -50.0; use one in \[-10, 10\]",
        ),
        (dict(sample=True, temperature=True), "temperature must be a finite number > 0"),
        (dict(sample=True, top_p=True), r"top_p must be in \(0, 1\]"),
        (dict(beam_size=2, length_penalty=False), "length_penalty must be a finite number"),
    ],
)
def test_numbers_that_overflow_or_are_not_numbers_are_refused(options: dict, match: str) -> None:
    with pytest.raises(OptionsError, match=match):
        GenerationOptions(**options)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("name", ["temperature", "top_p", "length_penalty"])
def test_every_float_option_must_be_finite(name: str, value: float) -> None:
    sample = name != "length_penalty"
    with pytest.raises(OptionsError, match=name):
        GenerationOptions(sample=sample, **{name: value})


def test_rows_per_batch_keeps_live_hypotheses_bounded() -> None:
    assert GenerationOptions(batch_size=32).rows_per_batch == 32
    assert GenerationOptions(beam_size=8, batch_size=32).rows_per_batch == 32
    assert GenerationOptions(beam_size=64, batch_size=32).rows_per_batch == 8
    assert GenerationOptions(batch_size=100_000).rows_per_batch == MAX_LIVE_HYPOTHESES
    for beam in range(1, MAX_BEAM_SIZE + 1):
        rows = GenerationOptions(beam_size=beam, batch_size=10_000).rows_per_batch
        assert rows >= 1 and rows * beam <= MAX_LIVE_HYPOTHESES


def test_generate_splits_a_wide_beam_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """batch_size 32 x beam 64 would hold 2048 hypotheses at once: the batch is split into
    engine calls of 8 inputs, and every input still gets its result, in order."""
    generator = Generator.load("g2p-en", providers="cpu", threads=1, search="loop")
    seen: list[int] = []
    original = generator_module.search

    def counting(model, src_ids: np.ndarray, options, rngs=None):
        seen.append(src_ids.shape[0])
        return original(model, src_ids, options, rngs)

    monkeypatch.setattr(generator_module, "search", counting)
    words = ["a", "to", "ab", "cat", "the", "dogs", "zebra", "on", "in", "be", "it", "go"] * 2
    options = GenerationOptions(beam_size=64, n_best=2, batch_size=32, max_new_tokens=3)
    results = generator.generate(words, options)
    assert seen == [8, 8, 8]
    assert [r.source.ids for r in results] == [generator.encode(w).ids for w in words]


def test_the_http_schema_refuses_a_huge_beam_and_non_finite_numbers() -> None:
    generator = Generator.load("g2p-en", providers="cpu", threads=1)

    def refusal(options: str) -> RequestError:
        body = f'{{"inputs": ["hello"], "options": {options}}}'.encode()
        with pytest.raises(RequestError) as caught:
            parse_generate(body, generator, Limits())
        assert caught.value.status == 422
        return caught.value

    assert "above the limit of 64" in str(refusal(json.dumps({"beam_size": 10000})))
    assert "temperature" in str(refusal('{"sample": true, "temperature": Infinity}'))
    assert "top_p" in str(refusal('{"sample": true, "top_p": NaN}'))
    assert "length_penalty" in str(refusal('{"beam_size": 2, "length_penalty": 1e300}'))
