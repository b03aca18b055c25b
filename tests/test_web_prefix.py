"""A forced target prefix in the browser runtime (`generate(text, {targetPrefix})` of
runtime/web/edgeseq.mjs): the ids it forces after the target language, its outputs and its
refusals equal Python's (`Generator.target_prefix`, `Generator.generate` with
`GenerationOptions.target_prefix`, `Generator.resolve`).

The outputs are compared on 300 inputs of each family's copy-trained import (conftest.py's
m2m_import and mbart50_import with two target languages, bart_import and t5_import), run
by onnxruntime-web (wasm) in Node.js, where `scripts/edge/setup.sh --npm` (or `make edge`)
has installed it (skipped with the reason otherwise). The refusals and the forced ids use
tests/edge/languages.mjs's stand-in decoder. Needs Node.js and the hf extra.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hf_fixtures import synthetic_corpus
from test_web_languages import HELPER
from test_web_tokenizer import NODE

from edgeseq.runtime.builtin import resolve_bundle
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
REPO = Path(__file__).parents[1]
FAMILIES = ("m2m_import", "mbart50_import", "bart_import", "t5_import")
PREFIXES = ("Ship", "Ka Lo", "tone-77")
JS_NAMES = {
    "target_prefix": "targetPrefix",
    "target_lang": "targetLang",
    "max_new_tokens": "maxNewTokens",
}
MAX_NEW = 16  # every case's budget: the prefix crowds out </s> for some inputs


def run(bundle: Path, cases: list[dict[str, Any]], *flags: str) -> list[dict[str, Any]]:
    """tests/edge/languages.mjs on `bundle` with `cases` (the stand-in decoder unless
    `flags` name --ort)."""
    result = subprocess.run(
        [NODE, str(HELPER), str(bundle), *flags], input=json.dumps(cases), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def as_browser(message: str) -> str:
    """Python's OptionsError message with the browser's option names."""
    message = message.removeprefix("invalid generation options: ")
    return message.replace("target_prefix", "targetPrefix").replace(
        "max_new_tokens", "maxNewTokens"
    )


@pytest.fixture(scope="module")
def onnxruntime_web() -> Path:
    """The node_modules folder holding onnxruntime-web, as `make edge` or `scripts/edge/setup.sh
    --npm` installs it (not installed by the test: npm is one of the heavy optional checks)."""
    cache = Path(os.environ.get("EDGESEQ_EDGE_CACHE", REPO / ".edge-cache"))
    modules = Path(os.environ.get("EDGESEQ_NODE_MODULES", cache / "npm" / "node_modules"))
    if not (modules / "onnxruntime-web").is_dir():
        pytest.skip("onnxruntime-web is not installed: run scripts/edge/setup.sh --npm first")
    return modules


def option_grid(gen: Generator) -> list[GenerationOptions]:
    """The default and one other target language (a bundle with languages), each with every
    prefix of PREFIXES."""
    languages, targets = gen.bundle.languages, [None]
    if languages is not None:
        targets.append(next(c for c in languages.codes if c != languages.default_target))
    return [
        GenerationOptions(target_lang=lang, target_prefix=prefix, max_new_tokens=MAX_NEW)
        for lang in targets
        for prefix in PREFIXES
    ]


def case(text: str, options: GenerationOptions) -> dict[str, Any]:
    """A languages.mjs case of `text` with `options`' language, prefix and budget."""
    out = {"text": text, "targetPrefix": options.target_prefix, "favour": 2}
    out |= {"maxNewTokens": options.max_new_tokens} if options.max_new_tokens else {}
    return out | ({"targetLang": options.target_lang} if options.target_lang else {})


@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_equal_pythons_on_300_inputs(
    family: str, onnxruntime_web: Path, request: pytest.FixtureRequest
) -> None:
    bundle = request.getfixturevalue(family)["bundle"]
    gen = Generator.load(bundle, providers="cpu", threads=1, variant="fp32", search="loop")
    grid = option_grid(gen)
    texts = [" ".join(line.split()[:3]) for line in synthetic_corpus("source", 300, seed=7)]
    cases, want = [], []
    for i, options in enumerate(grid):
        group = texts[i :: len(grid)]
        results = gen.generate(group, options.__class__(**{**vars(options), "batch_size": 1}))
        forced = gen.target_prefix(gen.resolve(options))
        for text, result in zip(group, results, strict=True):
            best = result.nbest[0]
            assert list(best.token_ids[: len(forced)]) == forced
            cases.append(case(text, options))
            want.append({"output": list(best.token_ids), "text": best.text})
    got = run(bundle, cases, "--ort", str(onnxruntime_web))
    assert [{"output": g["output"], "text": g["text"]} for g in got] == want
    distinct = {tuple(w["output"]) for w in want}
    assert len(distinct) > 3 * len(grid), len(distinct)  # outputs depend on the input
    for prefix in PREFIXES:  # every prefix starts some outputs, after its language
        assert any(w["text"].startswith(prefix) for w in want)


def test_forced_ids_are_pythons(m2m_import: dict[str, Any]) -> None:
    gen = Generator.load(m2m_import["bundle"], providers="cpu", threads=1)
    grid = option_grid(gen)
    got = run(m2m_import["bundle"], [case("Ka lo", options) for options in grid])
    for options, row in zip(grid, got, strict=True):
        forced = gen.target_prefix(gen.resolve(options))
        assert len(forced) > 1 and forced[0] in gen.bundle.languages.codes.values()
        assert row["output"] == forced  # the stand-in decoder ranks </s> first


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(target_prefix="東京"), "target vocabulary lacks"),
        (dict(target_prefix="Ship", max_new_tokens=2), "raise max_new_tokens"),
        (dict(target_prefix="Ship", target_lang="deu_Latn", max_new_tokens=1), "raise"),
        (dict(target_prefix=" "), "non-empty text"),
        (dict(target_prefix="Ship", target_lang="xx_Latn"), "is not one of this model's"),
    ],
)
def test_refusals_are_pythons(m2m_import: dict[str, Any], options: dict, says: str) -> None:
    gen = Generator.load(m2m_import["bundle"], providers="cpu", threads=1)
    with pytest.raises(OptionsError, match=says) as python:
        gen.generate(["Ka lo"], GenerationOptions(**options))
    js_case = {"text": "Ka lo", "favour": 2} | {JS_NAMES[k]: v for k, v in options.items()}
    got = run(m2m_import["bundle"], [js_case])
    name = "LanguageError" if "this model's" in says else "OptionsError"
    assert got == [{"error": f"{name}: {as_browser(str(python.value))}"}]


def test_the_search_graph_refuses_a_prefix() -> None:
    bundle = resolve_bundle("g2p-en")  # no languages: only the prefix is forced
    got = run(
        bundle, [{"text": "hello", "targetPrefix": "K AH0", "inGraph": True}], "--variant", "int8"
    )
    assert got == [{"error": "BundleError: the one-graph search forces no target language or "
                             "prefix; use generate() for them"}]  # fmt: skip


def test_a_gpt_bundle_is_refused_at_load(m2m_import: dict[str, Any], tmp_path: Path) -> None:
    """A decoder-only bundle (Python refuses its target_prefix) does not load in the browser."""
    bundle = tmp_path / "gpt"
    shutil.copytree(m2m_import["bundle"], bundle)
    config = json.loads((bundle / "config.json").read_text())
    config["model"]["architecture"] = "decoder-only"
    (bundle / "config.json").write_text(json.dumps(config))
    manifest = json.loads((bundle / "manifest.json").read_text())
    digest = hashlib.sha256((bundle / "config.json").read_bytes()).hexdigest()
    manifest["files"]["config.json"]["sha256"] = digest
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    loader = REPO / "tests" / "edge" / "load_bundle.mjs"
    out = subprocess.run(
        [NODE, str(loader), str(bundle)], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == {
        "error": "BundleError: the bundle is decoder-only; the web runtime runs encoder-decoder "
        "bundles only"
    }
