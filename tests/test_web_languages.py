"""The browser runtime (runtime/web/edgeseq.mjs, languages.mjs) on a bundle with languages
(an M2M-100 import in M2M100Tokenizer's layout): the source ids it feeds the encoder, the
target language it forces first, its step budget and its refusals equal the Python runtime's
(`Generator.encode`, `Languages.target_prefix`, `GenerationOptions.filled`), with the
bundle's defaults and per-call `{sourceLang, targetLang, maxNewTokens}`; its tokenizer gives
Python's ids on the converted SentencePiece BPE. The graphs are stood in for by a decoder that
ranks one id first (tests/edge/languages.mjs; test_edge.py runs real graphs in Chromium).
Needs Node.js and the hf extra; ~25 s."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_web_tokenizer import NODE, js_encode

pytest.importorskip("transformers", reason="the M2M-100 importer needs the hf extra")
pytest.importorskip("sentencepiece", reason="the test trains a SentencePiece model")

from click.testing import CliRunner
from hf_fixtures import synthetic_corpus
from m2m_fixtures import M2M100_TARGET, build_m2m_dir

from edgeseq.cli.main import cli
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
HELPER = Path(__file__).parent / "edge" / "languages.mjs"
TEXTS = ["ton", "the quick brown fox", "  Straße, naïve!  "]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("web-languages")
    checkpoint = build_m2m_dir(root / "m2m100-tiny", layout="m2m100")
    out = root / "bundle"
    result = CliRunner().invoke(cli, ["export", str(checkpoint), "--out", str(out), "--no-verify"])
    assert result.exit_code == 0, result.output
    return out


def browser(bundle: Path | None, cases: Any) -> Any:
    """tests/edge/languages.mjs on `bundle` (None: --generation) with `cases` on stdin."""
    args = [NODE, str(HELPER), str(bundle) if bundle else "--generation"]
    result = subprocess.run(
        args, input=json.dumps(cases), capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(result.stdout)


def test_source_ids_and_forced_target_equal_pythons(bundle: Path) -> None:
    gen = Generator.load(bundle)
    languages = gen.bundle.languages
    assert languages is not None and languages.default_target == M2M100_TARGET
    cases, want = [], []
    for text in TEXTS:
        for source_lang in (None, "fr"):
            for target_lang in (None, "de", "en"):
                case = {"text": text, "favour": 2}  # the decoder ranks </s> first
                case |= {"sourceLang": source_lang} if source_lang else {}
                case |= {"targetLang": target_lang} if target_lang else {}
                cases.append(case)
                ids = list(gen.encode(text, source_lang=source_lang).ids)
                want.append(
                    {
                        "encoded": ids,
                        "fed": ids,
                        "output": list(languages.target_prefix(target_lang)),
                    }
                )
    got = browser(bundle, cases)
    assert got == want
    assert {row["encoded"][0] for row in got} == {languages.codes["en"], languages.codes["fr"]}


def test_step_budget_follows_the_bundles_default_and_the_call(bundle: Path) -> None:
    gen = Generator.load(bundle)
    default = GenerationOptions().filled(gen.bundle.generation).max_new_tokens
    assert default is not None and default < gen.config.max_len  # recorded by the import
    de = gen.bundle.languages.codes["de"]
    cases = [
        {"text": "ton", "favour": 10, "targetLang": "de"},
        {"text": "ton", "favour": 10, "targetLang": "de", "maxNewTokens": 5},
    ]
    got = browser(bundle, cases)
    assert [row["output"] for row in got] == [[de] + [10] * (default - 1), [de, 10, 10, 10, 10]]


def test_unknown_codes_are_refused_with_pythons_message(bundle: Path) -> None:
    gen = Generator.load(bundle)
    got = browser(bundle, [
        {"text": "ton", "favour": 2, "targetLang": "xx"},
        {"text": "ton", "favour": 2, "sourceLang": "__en__"},
    ])  # fmt: skip
    for row, role, code in zip(got, ("target", "source"), ("xx", "__en__"), strict=True):
        with pytest.raises(OptionsError) as python:
            gen.bundle.languages.check(code, role)
        assert row == {"error": f"LanguageError: {python.value}"}
        assert ", ".join(gen.bundle.languages.codes) in row["error"]


def test_browser_tokenizer_gives_pythons_ids(bundle: Path) -> None:
    gen = Generator.load(bundle)
    lines = synthetic_corpus("source", 300, 5) + synthetic_corpus("target", 300, 6)
    lines += ["東京 and 東京x", "  \tspaces\n\nand  tabs  ", "ÅÉÎ ﬁ ①", "a literal </s> inside"]
    got = js_encode(bundle / "tokenizer.json", lines)
    tokenizer = gen.tokenizers.source
    assert [row["ids"] for row in got] == [tokenizer.encode(t) for t in lines]
    assert [row["text"] for row in got] == [tokenizer.decode(tokenizer.encode(t)) for t in lines]


def test_generation_settings_the_browser_lacks_are_named() -> None:
    settings = {"beam_size": 4, "length_penalty": 0.6, "max_new_tokens": 20}
    settings |= {"no_repeat_ngram_size": 3, "early_stopping": True, "forced_eos": True}
    config = {"generation": settings}
    got = browser(None, config)
    assert (got["beams"], got["lengthPenalty"], got["maxNewTokens"]) == (4, 0.6, 20)
    assert got["forcedEos"] is True
    assert got["notApplied"] == [
        "no_repeat_ngram_size=3",
        "forced_eos=true in generateInGraph (generate() applies it)",
        "beam_size=4 in generate() (greedy; generateInGraph applies it)",
    ]  # fmt: skip
    assert browser(None, {})["notApplied"] == []
