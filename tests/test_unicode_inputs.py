"""Every string a client can send is answered (issue 39): property-based tests over arbitrary
Unicode, unpaired surrogates, NULs, bidi controls, combining sequences and full-width forms
included. The tokenizer never raises, `Generator.generate` raises nothing but an edgeseq
error, and the API, the CLI and the server give the same answer for the same input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeseq.cli.main import cli
from edgeseq.runtime.errors import EdgeseqError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.results import result_json
from edgeseq.runtime.search import GenerationOptions
from edgeseq.runtime.tokenizer import utf8_text

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from serve_client import generate, running

from edgeseq.runtime.serve.app import create_app

# Every code point, surrogates (category Cs) included, and the awkward classes on purpose.
ANY_CHAR = st.characters(codec=None, exclude_categories=())
AWKWARD = st.sampled_from(
    ("\ud800", "\udfff", "\x00", "\u202e", "\u2066", "e\u0301", "ＡＢＣ", "\ufb01", "\u00a0",
     "😀" * 50, "a\tb", " abc ", "ｊｉｈ", "\U0010ffff", "\ufeff", "<pad>", "</s>", "\x85")
)  # fmt: skip
TEXT = st.one_of(st.text(ANY_CHAR, max_size=30), AWKWARD, st.lists(AWKWARD).map("".join))
CHECKS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def gen(runtime_case) -> Generator:
    return Generator.load(runtime_case.bundle, providers="cpu", threads=1)


def api_json(gen: Generator, texts: list[str], options: GenerationOptions) -> list[dict]:
    """What the API gives, in `generate --json`'s form (one object per input)."""
    results = gen.generate(texts, options)
    target = gen.tokenizers.target
    return [
        result_json(i, t, r, target) for i, (t, r) in enumerate(zip(texts, results, strict=True), 1)
    ]


@CHECKS
@given(text=TEXT)
def test_tokenizing_any_string_never_raises(gen: Generator, text: str) -> None:
    ids, unknown = gen.tokenize(text)
    assert all(isinstance(i, int) for i in ids)
    assert all(u.encode("utf-8") for u in unknown)  # what is echoed back is valid UTF-8


@CHECKS
@given(texts=st.lists(TEXT, min_size=1, max_size=4))
def test_generate_answers_or_refuses_with_an_edgeseq_error(gen: Generator, texts: list) -> None:
    try:
        rows = api_json(gen, texts, GenerationOptions(max_new_tokens=8))
    except EdgeseqError:
        return
    json.dumps(rows, ensure_ascii=False).encode("utf-8")  # a server can send it
    truncated = api_json(gen, texts, GenerationOptions(max_new_tokens=8, truncate=True))
    assert len(truncated) == len(texts)


@CHECKS
@given(texts=st.lists(TEXT, min_size=1, max_size=3))
def test_the_cli_answers_like_the_api(runtime_case, gen: Generator, texts: list) -> None:
    options = GenerationOptions(max_new_tokens=8, truncate=True)
    want = api_json(gen, texts, options)
    args = ["generate", str(runtime_case.bundle), "--json", "--provider", "cpu", "--threads"]
    args += ["1", "--max-new-tokens", "8", "--truncate", "--", *texts]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.split("\n") if line]  # \x85 is text
    assert rows == json.loads(json.dumps(want))


@pytest.fixture(scope="module")
def port(gen: Generator) -> Any:
    with running(create_app(gen)) as server_port:
        yield server_port


@CHECKS
@given(texts=st.lists(TEXT, min_size=1, max_size=4))
def test_the_server_answers_like_the_api(gen: Generator, port: int, texts: list) -> None:
    status, body = generate(port, texts, {"max_new_tokens": 8, "truncate": True})
    assert status == 200, body
    want = api_json(gen, texts, GenerationOptions(max_new_tokens=8, truncate=True))
    assert body["results"] == json.loads(json.dumps(want))


def test_an_unpaired_surrogate_is_read_as_the_replacement_character(gen: Generator) -> None:
    assert utf8_text("a\ud800b") == "a\ufffdb"
    assert utf8_text("\ud83d\ude00") == "😀"  # a pair is its character
    [lone, replaced] = gen.generate(["ab\udfffc", "ab\ufffdc"])
    assert lone.token_ids == replaced.token_ids and lone.source.unknown == ("\ufffd",)
