"""Sentence splitting of long inputs (runtime/sentences.py, `split_sentences`): an input split
into sentences gives its sentences' outputs joined in order, equal to generating them one by
one; the API, `edgeseq generate --split-sentences` and the server agree; without the split
extra the error names it."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli, main
from edgeseq.runtime import GenerationOptions, Generator
from edgeseq.runtime.errors import InputTooLongError, MissingDependencyError
from edgeseq.runtime.sentences import joiner, sentences, splitter_language

pytest.importorskip("sentencex", reason="the split extra is not installed")

# The reverse model of conftest.py (letters a-j, max_len 20): the first input is too long
# whole, its sentences are not; "." and "!" are outside the vocabulary (fed as <unk>).
LONG = "abcdef. ghij! abc. defg hij"
TEXTS = [LONG, "", "gij", "a. b"]


@pytest.fixture(scope="module")
def generator(runtime_case) -> Generator:
    return Generator.load(runtime_case.bundle, providers="cpu", threads=1)


def test_sentences_languages_and_joiners() -> None:
    assert sentences("I saw Dr. Smith. He left! Fine", "en") == [
        "I saw Dr. Smith.",
        "He left!",
        "Fine",
    ]
    assert sentences("Am 3. Mai kam er. Ja.", splitter_language("deu_Latn")) == [
        "Am 3. Mai kam er.",
        "Ja.",
    ]
    assert sentences("", "en") == [""] and sentences("  ", "en") == ["  "]
    codes = {"eng_Latn": "en", "__de__": "de", ">>fra<<": "fr", "ja": "ja", None: "en"}
    assert {code: splitter_language(code) for code in codes} == codes
    assert joiner("jpn_Jpan") == "" and joiner("zho_Hans") == "" and joiner(None) == " "


@pytest.mark.parametrize("beam", [1, 3])
def test_split_outputs_equal_the_sentences_one_by_one(generator: Generator, beam: int) -> None:
    with pytest.raises(InputTooLongError):
        generator.generate([LONG], GenerationOptions(beam_size=beam))
    split = generator.generate(TEXTS, GenerationOptions(beam_size=beam, split_sentences=True))
    assert len(split) == len(TEXTS)
    for text, result in zip(TEXTS, split, strict=True):
        parts = sentences(text, "en")
        one_by_one = generator.generate(parts, GenerationOptions(beam_size=beam))
        run = [r for r in one_by_one if not r.skipped]
        assert result.text == " ".join(r.text for r in run)
        assert result.token_ids == tuple(i for r in run for i in r.token_ids)
        assert result.logprob == pytest.approx(sum(r.logprob for r in run))
        assert result.source.ids == tuple(i for r in one_by_one for i in r.source.ids)
    assert len(sentences(LONG, "en")) == 4 and split[0].text.count(" ") >= 3
    assert split[1].skipped == "empty" and split[2].text == generator.generate(["gij"])[0].text
    with pytest.raises(InputTooLongError, match=r"^input 1, sentence 2: input has 22 source"):
        long_sentence = "ab. " + "abcdefghij" * 2 + "!"
        generator.generate(["ab", long_sentence], GenerationOptions(split_sentences=True))


def test_cli_api_and_server_agree(generator: Generator, runtime_case) -> None:
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    from serve_client import generate, running

    from edgeseq.runtime.serve.app import create_app
    from edgeseq.runtime.serve.batcher import BatchSettings

    api = generator.generate(TEXTS, GenerationOptions(beam_size=2, split_sentences=True))
    args = ["generate", str(runtime_case.bundle), *TEXTS, "--json", "--split-sentences"]
    result = CliRunner().invoke(cli, [*args, "--beam", "2"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    app = create_app(generator, BatchSettings(max_batch=8, max_wait_ms=5))
    with running(app) as port:
        status, body = generate(port, TEXTS, {"beam_size": 2, "split_sentences": True})
        too_long, refused = generate(port, [LONG], {"beam_size": 2})
    assert status == 200, body
    assert [r["output"] for r in body["results"]] == [r["output"] for r in rows]
    assert [r["output"] for r in rows] == [r.text for r in api]
    assert [r.get("ids") for r in body["results"]] == [r.get("ids") for r in rows]
    assert too_long == 422 and "max_len" in refused["error"]


def test_without_the_split_extra_the_error_names_it(
    generator: Generator,
    runtime_case,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.setitem(sys.modules, "sentencex", None)  # import sentencex -> ImportError
    with pytest.raises(MissingDependencyError, match=r"edgeseq\[split\]"):
        generator.generate(["abc. def"], GenerationOptions(split_sentences=True))
    with pytest.raises(SystemExit) as exited:
        main(["generate", str(runtime_case.bundle), "abc", "abc. def", "--split-sentences"])
    out, err = capsys.readouterr()
    assert exited.value.code == 1 and out == ""  # refused before any output
    assert err.startswith("error: sentence splitting needs") and err.count("\n") == 1
    assert "pip install 'edgeseq[split]'" in err
    assert generator.generate(["abc"])[0].text  # whole inputs need no splitter
