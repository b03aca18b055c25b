"""Vocabulary fingerprints (issue 39, item 1): a tokenizer of the same size and special ids
as the model's but another order of tokens is refused by load, inspect, verify, generate,
serve and the browser runtime, for the three model kinds and an imported model, even when
the manifest's checksums were rewritten to match it; bundles exported before fingerprints
still load. The fingerprint's definition (runtime/vocabulary.py, docs/bundle.md) is pinned
by RFC 8785's number examples and computed alike in Python and JavaScript."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from serve_client import EDGESEQ
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from edgeseq.cli.main import cli
from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.manifest import sha256_file
from edgeseq.runtime.tokenizer import Tokenizer
from edgeseq.runtime.vocabulary import (
    METADATA_KEYS,
    canonical_json,
    fingerprint,
    fingerprint_file,
    read_onnx_metadata,
)

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
HELPER = Path(__file__).parent / "edge" / "load_bundle.mjs"
ROOT = Path(__file__).resolve().parents[1]
REFUSED = "does not match the vocabulary the graphs were exported with"


def rehash(bundle: Path) -> None:
    """Rewrite every checksum of the manifest to the files as they are now."""
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    for name, entry in manifest["files"].items():
        entry["sha256"] = sha256_file(bundle / name)
        entry["bytes"] = (bundle / name).stat().st_size
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")


def swap_two_tokens(bundle: Path, name: str = C.TOKENIZER_FILE) -> None:
    """Exchange the ids of the first two non-special tokens of tokenizer file `name` (same
    size, same special ids: only the fingerprint can tell) and rehash the manifest."""
    path = bundle / name
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    a, b = (t for t, i in vocab.items() if i in (len(C.SPECIAL_TOKENS), len(C.SPECIAL_TOKENS) + 1))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    rehash(bundle)


def copy(bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / bundle.name
    shutil.copytree(bundle, out)
    return out


def node(*args: str) -> Any:
    result = subprocess.run(
        [NODE, str(HELPER), *args], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(result.stdout)


# -- the definition ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "text"),
    [  # RFC 8785, appendix B, and the ECMAScript forms around the exponent limits
        (333333333.33333329, "333333333.3333333"),
        (1e30, "1e+30"),
        (4.50, "4.5"),
        (2e-3, "0.002"),
        (1e-27, "1e-27"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (-10000.0, "-10000"),
        (-0.0, "0"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
    ],
)
def test_numbers_are_written_as_rfc8785_says(value: float, text: str) -> None:
    assert canonical_json(value) == text


def test_canonical_json_sorts_keys_by_utf16_and_escapes_as_json_stringify() -> None:
    value = {"b": [1, True, None], "a": 'é\n\x1f"\\', "\ufb01": 1, "\U0001f600": 2}
    assert canonical_json(value) == (
        '{"a":"é\\n\\u001f\\"\\\\","b":[1,true,null],"\U0001f600":2,"\ufb01":1}'
    )  # U+1F600 is the surrogate pair D83D DE00, before U+FB01 in UTF-16 order


def test_the_fingerprint_sees_ids_and_rules_not_formatting() -> None:
    tok = Tokenizer.train_char(["abcdef"], normalize=("nfc", "lowercase"))
    data = json.loads(tok.to_str())
    base = fingerprint(data)
    assert base == fingerprint(json.loads(json.dumps(data)))  # key order, spacing: no change
    flags = json.loads(tok.to_str())
    flags["added_tokens"][0]["lstrip"] = True  # an added token's flags: not hashed
    assert fingerprint(flags) == base
    swapped = json.loads(tok.to_str())
    vocab = swapped["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    assert fingerprint(swapped) != base
    rules = json.loads(tok.to_str())
    rules["normalizer"]["normalizers"].pop()  # no Lowercase: other ids for "A"
    assert fingerprint(rules) != base


def _unigram(path: Path) -> None:
    scores = [0.0, 0.0, 0.0, -1e4, -1.5, -2.25e-7, -3.0000000000000004, -12345678.9, -1e-6]
    pieces = ["<pad>", "<s>", "</s>", "<unk>", "▁a", "b", "ab", "é", "\U0001f600"]
    hf = HFTokenizer(models.Unigram(list(zip(pieces, scores, strict=True)), unk_id=3))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.save(str(path))


@needs_node
def test_python_and_javascript_compute_the_same_fingerprints(tmp_path: Path) -> None:
    corpus = ["hello wörld", "ΟΔΟΣ straße", "a b c ab abc"]
    files = {}
    for kind in ("char", "word", "bpe"):
        tok = Tokenizer.train(kind, corpus * 5, vocab_size=40, normalize=("nfc", "strip"))
        files[kind] = tmp_path / f"{kind}.json"
        tok.save(files[kind])
    files["unigram"] = tmp_path / "unigram.json"
    _unigram(files["unigram"])
    got = node("--fingerprint", *map(str, files.values()))
    assert got == {str(path): fingerprint_file(path) for path in files.values()}


# -- the export records them ------------------------------------------------------------------
def _sides(bundle: Path) -> dict[str, str]:
    names = json.loads((bundle / C.CONFIG_FILE).read_text(encoding="utf-8"))["tokenizers"]
    return {side: fingerprint_file(bundle / names[side]) for side in ("source", "target")}


def _recorded_everywhere(bundle: Path) -> None:
    want = _sides(bundle)
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    assert manifest["vocabulary"] == want
    expected = {METADATA_KEYS[side]: value for side, value in want.items()}
    graphs = [p for p in bundle.iterdir() if p.suffix in (".onnx", ".ort")]
    assert graphs
    for graph in graphs:
        if graph.suffix == ".onnx":
            meta = read_onnx_metadata(graph)
            assert meta == {p.key: p.value for p in onnx.load(str(graph)).metadata_props}
        else:  # ORT format: read by onnxruntime
            options = ort.SessionOptions()
            session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
            meta = session.get_modelmeta().custom_metadata_map
        assert {k: meta.get(k) for k in expected} == expected, graph.name


def test_every_variant_and_the_search_graph_carry_the_fingerprints(search_bundle: Path) -> None:
    names = {p.name for p in search_bundle.iterdir()}
    assert {"encoder.int8.onnx", "decoder.ort", "search.onnx", "search.int8.onnx"} <= names
    _recorded_everywhere(search_bundle)


def test_gpt_and_bert_bundles_carry_the_fingerprints(gpt_case, bert_case) -> None:
    _recorded_everywhere(gpt_case["bundle"])
    _recorded_everywhere(bert_case["bundle"])
    assert _sides(bert_case["bundle"])["source"] != _sides(bert_case["bundle"])["target"]


@needs_node
def test_javascript_reads_the_graphs_metadata_as_python(search_bundle: Path) -> None:
    for name in ("encoder.onnx", "decoder.int8.onnx", "search.onnx"):
        assert node("--metadata", str(search_bundle / name)) == read_onnx_metadata(
            search_bundle / name
        )


# -- a swapped vocabulary is refused ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["seq2seq", "gpt", "bert-labels"])
def test_a_reordered_tokenizer_is_refused_by_load(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if kind == "seq2seq":
        bundle, name = request.getfixturevalue("runtime_case").bundle, C.TOKENIZER_FILE
    elif kind == "gpt":
        bundle, name = request.getfixturevalue("gpt_case")["bundle"], C.TOKENIZER_FILE
    else:  # BERT's target "vocabulary" is its label names: a re-ordering swaps labels
        bundle, name = request.getfixturevalue("bert_case")["bundle"], "tokenizer.target.json"
    bundle = copy(bundle, tmp_path)
    load_bundle(bundle)
    swap_two_tokens(bundle, name)
    with pytest.raises(BundleError, match=rf"{name} {REFUSED} \(fingerprint [0-9a-f]{{16}}"):
        load_bundle(bundle)
    with pytest.raises(BundleError, match=REFUSED):
        Generator.load(bundle, providers="cpu", threads=1)


def test_the_graphs_refuse_it_when_the_manifest_was_rewritten_too(runtime_case, tmp_path) -> None:
    bundle = copy(runtime_case.bundle, tmp_path)
    swap_two_tokens(bundle)
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["vocabulary"]["source"] = fingerprint_file(bundle / C.TOKENIZER_FILE)
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(BundleError, match=rf"{REFUSED} .*, (de|en)coder\.onnx records"):
        load_bundle(bundle)


def test_a_malformed_recorded_fingerprint_is_refused(runtime_case, tmp_path: Path) -> None:
    bundle = copy(runtime_case.bundle, tmp_path)
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["vocabulary"]["target"] = ["not", "hex"]
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(BundleError, match="records the target vocabulary fingerprint as"):
        load_bundle(bundle)


def test_a_graph_that_is_not_onnx_is_one_line(runtime_case, tmp_path: Path) -> None:
    from edgeseq.runtime import Generator

    bundle = copy(runtime_case.bundle, tmp_path)
    (bundle / C.DECODER_FILE).write_bytes(b"\xff" * 9)  # a varint that never ends
    rehash(bundle)
    load_bundle(bundle)  # the fingerprint check skips it: a variant may be broken (bench)
    with pytest.raises(BundleError, match=r"decoder\.onnx"):
        Generator.load(bundle, providers="cpu")


def _one_line_refusal(result: Any, name: str) -> None:
    text = result.output + str(result.exception or "")
    assert result.exit_code == 1, text
    assert f"{name} {REFUSED}" in text and "Traceback" not in text


def test_inspect_verify_generate_and_serve_refuse_it(runtime_case, tmp_path: Path) -> None:
    bundle = copy(runtime_case.bundle, tmp_path)
    swap_two_tokens(bundle)
    runner = CliRunner()
    _one_line_refusal(runner.invoke(cli, ["inspect", str(bundle)]), C.TOKENIZER_FILE)
    # verify loads the bundle before it reads the checkpoint
    args = ["verify", str(bundle), "--checkpoint", str(tmp_path)]
    _one_line_refusal(runner.invoke(cli, args), C.TOKENIZER_FILE)
    args = ["generate", str(bundle), "abc", "--provider", "cpu"]
    _one_line_refusal(runner.invoke(cli, args), C.TOKENIZER_FILE)
    served = subprocess.run(
        [*EDGESEQ, "serve", str(bundle), "--port", "0", "--provider", "cpu"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert served.returncode == 1, served.stderr
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{C.TOKENIZER_FILE} {REFUSED}" in lines[0], served.stderr


def test_verify_of_a_gpt_bundle_refuses_it(gpt_case, tmp_path: Path) -> None:
    bundle = copy(gpt_case["bundle"], tmp_path)
    swap_two_tokens(bundle)
    args = ["verify", str(bundle), "--checkpoint", str(gpt_case["run"]), "--inputs", "20"]
    _one_line_refusal(CliRunner().invoke(cli, args), C.TOKENIZER_FILE)


@needs_node
def test_the_browser_runtime_refuses_it(runtime_case, tmp_path: Path) -> None:
    assert node(str(runtime_case.bundle)) == {"ok": True}
    bundle = copy(runtime_case.bundle, tmp_path)
    swap_two_tokens(bundle, "tokenizer.target.json")
    got = node(str(bundle))
    assert got["error"].startswith(f"BundleError: tokenizer.target.json {REFUSED}"), got
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["vocabulary"]["target"] = fingerprint_file(bundle / "tokenizer.target.json")
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    assert "encoder.onnx records" in node(str(bundle))["error"]


# -- bundles exported before fingerprints -----------------------------------------------------
def strip_fingerprints(bundle: Path) -> None:
    """Make `bundle` look exported before fingerprints: none in the manifest or graphs."""
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    del manifest["vocabulary"]
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    for graph in bundle.glob("*.onnx"):
        proto = onnx.load(str(graph))
        kept = [p for p in proto.metadata_props if p.key not in METADATA_KEYS.values()]
        del proto.metadata_props[:]
        proto.metadata_props.extend(kept)
        onnx.save_model(proto, str(graph))
    rehash(bundle)


def test_bundles_without_fingerprints_load_and_answer_alike(runtime_case, tmp_path) -> None:
    bundle = copy(runtime_case.bundle, tmp_path)
    strip_fingerprints(bundle)
    assert all(METADATA_KEYS["source"] not in read_onnx_metadata(g) for g in bundle.glob("*.onnx"))
    words = ["abc", "jihg", "cafe"]
    old = Generator.load(bundle, providers="cpu", threads=1).generate(words)
    new = Generator.load(runtime_case.bundle, providers="cpu", threads=1).generate(words)
    assert [r.token_ids for r in old] == [r.token_ids for r in new]
    if NODE is not None:
        assert node(str(bundle)) == {"ok": True}


# -- an imported model ------------------------------------------------------------------------
def test_an_imported_model_records_and_checks_its_vocabulary(tmp_path: Path) -> None:
    source = tmp_path / "tx"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "torch_transformer" / "make_example.py"),
         str(source)], check=True, timeout=120,
    )  # fmt: skip
    bundle = tmp_path / "bundle"
    args = ["export", str(source / "torch_source.json"), "--out", str(bundle), "--no-verify"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    _recorded_everywhere(bundle)
    swap_two_tokens(bundle)
    with pytest.raises(BundleError, match=rf"{C.TOKENIZER_FILE} {REFUSED}"):
        load_bundle(bundle)
