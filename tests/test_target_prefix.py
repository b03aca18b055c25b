"""A forced target prefix (`GenerationOptions.target_prefix`, `edgeseq generate
--target-prefix`, the HTTP option `target_prefix`): every output starts with the text's ids,
after the target language of a multilingual model; the API, the CLI and the server answer
alike; what cannot be forced is refused in one line.

The built-in g2p-en bundle (phonemes) serves the plain case; the tiny NLLB-layout import of
conftest.py the case with a language token before the prefix.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from serve_client import generate as http_generate
from serve_client import running

from edgeseq.cli.main import cli, main
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions

WORDS = ["hello", "world", "prefix"]


@pytest.fixture(scope="module")
def g2p() -> Generator:
    return Generator.load("g2p-en", providers="cpu", threads=1)


@pytest.mark.parametrize("beam", [1, 3])
def test_outputs_start_with_the_prefix(g2p: Generator, beam: int) -> None:
    forced = g2p.tokenizers.target.encode("K AH0")
    free = g2p.generate(WORDS, GenerationOptions(beam_size=beam))
    results = g2p.generate(WORDS, GenerationOptions(beam_size=beam, target_prefix="K AH0"))
    for word, plain, result in zip(WORDS, free, results, strict=True):
        best = result.nbest[0]
        assert list(best.token_ids[:2]) == forced, word
        assert best.text.startswith("K AH0"), best.text
        assert best.text != plain.nbest[0].text  # none of the words starts with K AH0


def test_api_cli_and_server_answer_alike(g2p: Generator) -> None:
    from edgeseq.runtime.results import result_json
    from edgeseq.runtime.serve.app import create_app
    from edgeseq.runtime.serve.batcher import BatchSettings

    options = GenerationOptions(target_prefix="S")
    target = g2p.tokenizers.target
    results = g2p.generate(WORDS, options)
    api = [
        result_json(i + 1, w, r, target)
        for i, (w, r) in enumerate(zip(WORDS, results, strict=True))
    ]
    out = CliRunner().invoke(cli, ["generate", "g2p-en", "--json", "--target-prefix", "S", *WORDS])
    assert out.exit_code == 0, out.output
    cli_answers = [json.loads(line) for line in out.stdout.splitlines()]
    with running(create_app(g2p, BatchSettings(max_wait_ms=10))) as port:
        status, body = http_generate(port, WORDS, {"target_prefix": "S"})
    assert status == 200, body
    for ours, cli_one, http_one in zip(api, cli_answers, body["results"], strict=True):
        assert cli_one["output"] == http_one["output"] == ours["output"]
        assert cli_one["ids"] == http_one["ids"] == ours["ids"]
        assert ours["output"].startswith("S")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(target_prefix="K QQ"), "target vocabulary lacks"),
        (dict(target_prefix="K AH0", max_new_tokens=2), "raise max_new_tokens"),
        (dict(target_prefix=" "), "non-empty text"),
        (dict(target_prefix="K", split_sentences=True), "leave out split_sentences"),
    ],
)
def test_what_cannot_be_forced_is_refused(g2p: Generator, options: dict, says: str) -> None:
    with pytest.raises(OptionsError, match=says):
        g2p.generate(["hello"], GenerationOptions(**options))


def test_cli_refusal_is_one_line(capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["generate", "g2p-en", "--target-prefix", "K QQ", "hello"])
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert err.count("\n") == 1 and err.startswith("error: target_prefix 'K QQ'")


def test_prefix_follows_the_target_language(m2m_import: dict[str, Any]) -> None:
    gen = Generator.load(m2m_import["bundle"], providers="cpu", threads=1)
    text = m2m_import["data"].read_text(encoding="utf-8").splitlines()[0].split("\t")[0]
    options = GenerationOptions(target_lang="fra_Latn", target_prefix="Ship")
    best = gen.generate([text], options)[0].nbest[0]
    language = gen.bundle.languages.codes["fra_Latn"]
    assert list(best.token_ids[:1]) == [language]
    prefix = gen.tokenizers.target.encode("Ship")
    assert list(best.token_ids[1 : 1 + len(prefix)]) == prefix
    assert best.text.startswith("Ship")  # the language token is dropped when decoding
