"""Resource bounds (issue 24, class 8): every float option is a finite number of a sensible
range, in the API and in the HTTP request schema; a beam or a batch that would exhaust memory
is refused there too with the limit named."""

from __future__ import annotations

import json

import pytest

from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import MAX_LENGTH_PENALTY, GenerationOptions
from edgeseq.runtime.serve.request import Limits, RequestError, parse_generate


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(beam_size=4, length_penalty=1e300), r"got 1e\+300; use one in \[-10, 10\]"),
        (dict(beam_size=4, length_penalty=-50.0), r"got -50.0; use one in \[-10, 10\]"),
        (dict(sample=True, temperature=True), "temperature must be a finite number > 0"),
        (dict(sample=True, top_p=True), r"top_p must be in \(0, 1\]"),
        (dict(beam_size=2, length_penalty=False), "length_penalty must be a finite number"),
    ],
)
def test_numbers_that_overflow_or_are_not_numbers_are_refused(options: dict, match: str) -> None:
    """length_penalty 1e300 overflowed in `length ** penalty` (an OverflowError traceback);
    True passed as temperature 1."""
    with pytest.raises(OptionsError, match=match):
        GenerationOptions(**options)


def test_the_length_penalty_range_is_open_to_usual_values() -> None:
    for value in (-MAX_LENGTH_PENALTY, 0, 0.6, 2, MAX_LENGTH_PENALTY):
        assert GenerationOptions(beam_size=2, length_penalty=value).length_penalty == value


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("name", ["temperature", "top_p", "length_penalty"])
def test_every_float_option_must_be_finite(name: str, value: float) -> None:
    sample = name != "length_penalty"
    with pytest.raises(OptionsError, match=name):
        GenerationOptions(sample=sample, **{name: value})


def test_the_http_schema_refuses_huge_beams_and_numbers_out_of_range() -> None:
    generator = Generator.load("g2p-en", providers="cpu", threads=1)

    def refusal(options: str) -> str:
        body = f'{{"inputs": ["hello"], "options": {options}}}'.encode()
        with pytest.raises(RequestError) as caught:
            parse_generate(body, generator, Limits())
        assert caught.value.status == 422
        return str(caught.value)

    assert "above the limit of 128" in refusal(json.dumps({"beam_size": 10000}))
    assert "temperature" in refusal('{"sample": true, "temperature": Infinity}')
    assert "top_p" in refusal('{"sample": true, "top_p": NaN}')
    assert "use one in [-10, 10]" in refusal('{"beam_size": 2, "length_penalty": 1e300}')
    assert "temperature must be a finite number" in refusal(
        '{"sample": true, "temperature": 1e999}'
    )
