"""GPT and BERT end to end: train a few steps on words / stress, export with parity and int8,
the bundles' files, names and manifests, past length 0, and onnxruntime-genai on the GPT."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeseq.runtime import constants as C

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _check_manifest(case: dict[str, Any], kind: str, architecture: str) -> None:
    manifest, bundle = case["manifest"], case["bundle"]
    assert manifest["kind"] == kind and manifest["architecture"] == architecture
    parity = manifest["parity"]
    assert parity["passed"], parity
    assert all(parity[f"level{i}"]["passed"] for i in (1, 2, 3))
    assert parity["level3"]["identical"] == parity["level3"]["inputs"] == 60
    assert max(parity["level1"]["max_abs_diff"].values()) <= parity["tolerance"]
    int8 = manifest["variants"]["int8"]
    assert int8["model"] == "model.int8.onnx" and int8["gate"]["inputs"] == 60
    assert int8["verified"] and int8["bytes"] < manifest["variants"]["fp32"]["bytes"]
    on_disk = json.loads((bundle / "manifest.json").read_text())
    assert on_disk["files"].keys() >= {"model.onnx", "model.int8.onnx", "config.json"}
    config = json.loads((bundle / "config.json").read_text())
    assert config["model"]["architecture"] == architecture and config["kind"] == kind


def test_gpt_bundle_manifest_parity_and_files(gpt_case: dict[str, Any]) -> None:
    _check_manifest(gpt_case, "gpt", "decoder-only")
    files = json.loads((gpt_case["bundle"] / "manifest.json").read_text())["files"]
    assert {"genai_config.json", "tokenizer.json"} <= files.keys()
    assert "tokenizer.target.json" not in files  # one vocabulary


def test_bert_bundle_manifest_parity_and_files(bert_case: dict[str, Any]) -> None:
    _check_manifest(bert_case, "bert", "encoder-only")
    session = _session(bert_case["bundle"] / "model.onnx")
    assert tuple(i.name for i in session.get_inputs()) == C.BERT_INPUTS
    assert tuple(o.name for o in session.get_outputs()) == C.BERT_OUTPUTS
    labels = json.loads((bert_case["bundle"] / "tokenizer.target.json").read_text())
    assert {"1", "2", "3"} <= set(labels["model"]["vocab"])


def test_genai_config_fields(gpt_case: dict[str, Any]) -> None:
    config = json.loads((gpt_case["bundle"] / "genai_config.json").read_text())
    model, decoder = config["model"], config["model"]["decoder"]
    assert model["type"] == "decoder" and decoder["filename"] == "model.onnx"
    assert (decoder["num_attention_heads"], decoder["head_size"], decoder["hidden_size"]) == (
        4,
        8,
        32,
    )
    assert decoder["num_key_value_heads"] == 4 and decoder["num_hidden_layers"] == 2
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (1, 2, 0)
    assert model["context_length"] == 24 and config["search"]["past_present_share_buffer"] is False


def test_gpt_graph_names_and_past_length_zero(gpt_case: dict[str, Any]) -> None:
    from edgeseq.build_model.checkpoint import load_checkpoint
    from edgeseq.export.kinds.decoder_only import gpt_feeds, torch_run
    from edgeseq.export.kinds.one_graph import session_run

    model, _, _ = load_checkpoint(gpt_case["run"])
    session = _session(gpt_case["bundle"] / "model.onnx")
    assert tuple(i.name for i in session.get_inputs()) == C.gpt_inputs(2)
    assert tuple(o.name for o in session.get_outputs()) == C.gpt_outputs(2)
    shapes = {i.name: i.shape for i in session.get_inputs()}
    assert shapes[C.ATTENTION_MASK] == [C.BATCH, C.TOTAL_SEQUENCE_LENGTH]
    for length in (1, 2, 7):  # batch 1, past 0: sizes the trace never saw
        ids = np.array([[1, *range(5, 5 + length - 1)]], dtype=np.int64)
        feeds = gpt_feeds(model.cfg, ids, np.ones_like(ids), np.arange(length)[None])
        got, want = session_run(session)(feeds), torch_run(model)(feeds)
        assert got[1].shape == (1, 4, length, 8)
        np.testing.assert_allclose(got[0], want[0], atol=1e-4)


def test_parity_catches_another_model(gpt_case: dict[str, Any]) -> None:
    import torch

    from edgeseq.build_model.checkpoint import load_checkpoint
    from edgeseq.build_model.decoder_only import DecoderOnlyTransformer
    from edgeseq.export.kinds.one_graph import run_one_graph_parity, session_run

    model, _, _ = load_checkpoint(gpt_case["run"])
    torch.manual_seed(1)
    other = DecoderOnlyTransformer(model.cfg).eval()
    session = session_run(_session(gpt_case["bundle"] / "model.onnx"))
    report = run_one_graph_parity(other, session, [[5, 6], [7]])
    assert not report["level1"]["passed"] and not report["passed"]


def test_onnxruntime_genai_runs_the_bundle_as_is(gpt_case: dict[str, Any]) -> None:
    og = pytest.importorskip(
        "onnxruntime_genai", reason="onnxruntime-genai not installed (make test installs it)"
    )
    from edgeseq.build_model.checkpoint import load_checkpoint
    from edgeseq.export.kinds.decoder_only import greedy_loop
    from edgeseq.export.kinds.one_graph import session_run

    model, tokenizers, _ = load_checkpoint(gpt_case["run"])
    session = session_run(_session(gpt_case["bundle"] / "model.onnx"))
    genai = og.Model(str(gpt_case["bundle"]))
    for prompt in ("photo", "inter", ""):
        ids = tokenizers.source.encode(prompt)
        params = og.GeneratorParams(genai)
        params.set_search_options(max_length=model.cfg.max_len, do_sample=False)
        generator = og.Generator(genai, params)
        generator.append_tokens(np.array([[model.cfg.bos_id, *ids]], dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        got = [int(t) for t in generator.get_sequence(0)][1 + len(ids) :]
        got = [t for t in got if t != model.cfg.eos_id]
        (want,), _, _ = greedy_loop(session, model.cfg, [ids], model.cfg.max_len)
        assert got == want, prompt


def test_verify_rechecks_parity_and_refuses_a_tampered_bundle(
    gpt_case: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import verify_bundle
    from edgeseq.runtime.errors import BundleError

    report = verify_bundle(gpt_case["bundle"], gpt_case["run"], ExportOptions(inputs=20))
    assert report["passed"] and report["level3"]["inputs"] == 20
    copy = tmp_path / "copy"
    shutil.copytree(gpt_case["bundle"], copy)
    with (copy / "genai_config.json").open("a") as f:
        f.write(" ")
    with pytest.raises(BundleError, match=r"genai_config\.json does not match its sha256"):
        verify_bundle(copy, gpt_case["run"], ExportOptions(inputs=20))


def test_a_missed_int8_gate_is_one_error_with_its_table(
    bert_case: dict[str, Any], tmp_path: Path
) -> None:
    from edgeseq.export.gate import GateError
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import export_checkpoint
    from edgeseq.export.report import format_attempts
    from edgeseq.export.variants import VariantOptions

    impossible = VariantOptions(("fp32", "int8"), max_metric_drop=-100.0)
    with pytest.raises(GateError, match="int8 misses the accuracy gate") as error:
        export_checkpoint(
            bert_case["run"], tmp_path / "b", ExportOptions(inputs=20, variants=impossible)
        )
    assert "(nothing)" in format_attempts(error.value.attempts)  # no layer kept in fp32
    assert not (tmp_path / "b").exists()
