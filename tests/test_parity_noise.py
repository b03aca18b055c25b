"""Parity bounds that follow the model's own float32 error (export/kinds/seq2seq/
float64_noise.py): a model whose logits reach the thousands passes levels 1 and 2 where the
flat tolerance would fail it, and a real error in the graphs still fails them."""

from __future__ import annotations

import copy

import pytest
import torch

from edgeseq.export.kinds.seq2seq.bundle import export_bundle
from edgeseq.export.kinds.seq2seq.parity import level2_steps, open_engine
from edgeseq.export.kinds.seq2seq.parity_graphs import level1_graphs
from edgeseq.export.parity import NOISE_FACTOR, TOLERANCE_FP32, random_sources
from edgeseq.export.report import format_parity
from edgeseq.runtime import constants as C


@pytest.fixture(scope="module")
def loud(runtime_model, tmp_path_factory: pytest.TempPathFactory):
    """runtime_model with its output projection scaled 400x (logits in the thousands; the
    same argmax), exported without parity: (model, engine)."""
    model = copy.deepcopy(runtime_model.model)
    with torch.no_grad():
        model.output.weight.mul_(400.0)
        if model.output.bias is not None:
            model.output.bias.mul_(400.0)
    bundle = tmp_path_factory.mktemp("loud") / "bundle"
    task = {"name": "reverse", "options": {}}
    export_bundle(model, runtime_model.tokenizers, bundle, task=task, verify=False)
    return model, open_engine(bundle / C.ENCODER_FILE, bundle / C.DECODER_FILE, model.cfg)


def test_levels_1_and_2_bound_a_loud_model_by_its_own_float32_error(loud) -> None:
    model, engine = loud
    level1 = level1_graphs(model, engine)
    assert level1["max_abs_diff"]["logits"] > TOLERANCE_FP32  # the flat bound would fail it
    noise = level1["float64_noise"]["logits"]
    assert level1["bound"]["logits"] == pytest.approx(TOLERANCE_FP32 + NOISE_FACTOR * noise)
    for family, diff in level1["max_abs_diff"].items():  # a family within it: the tolerance
        assert diff > TOLERANCE_FP32 or level1["bound"][family] == TOLERANCE_FP32
    assert level1["passed"], level1
    level2 = level2_steps(model, engine, random_sources(model, 8))
    assert level2["passed"], level2
    report = {"tolerance": TOLERANCE_FP32, "level1": level1, "level2": level2, "passed": True}
    report["seconds"] = 0.0
    report["level3"] = {"identical": 1, "inputs": 1, "passed": True}
    assert "torch's float32 error" in format_parity(report)


def test_an_error_in_the_graph_still_fails_level_1(loud) -> None:
    model, engine = loud
    wrong = copy.deepcopy(model)
    with torch.no_grad():  # what a mapping error looks like: one weight off by a little
        wrong.decoder_layers[0].ffn.w_2.bias[0] += 0.05
    level1 = level1_graphs(wrong, engine)
    assert not level1["passed"]
    assert level1["max_abs_diff"]["logits"] > level1["bound"]["logits"]
