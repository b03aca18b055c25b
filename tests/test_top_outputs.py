"""The decoder graphs' search outputs (issue 47, item 1): `topk_ids`, `topk_logits` and
`log_normalizer` of the last position, read by greedy and beam search instead of the logits.

Greedy and beam-4 ids must be identical to the logits path (numpy's float64 log-softmax) on
the level-3 inputs, scores within 1e-4; bundles exported before the outputs keep loading
and decoding through the logits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from edgeseq.export.kinds.seq2seq.top_parity import TOP_SCORE_TOLERANCE, logits_path, top_parity
from edgeseq.export.parity import random_sources
from edgeseq.export.top_outputs import strip_top_outputs
from edgeseq.runtime import Generator
from edgeseq.runtime import constants as C
from edgeseq.runtime.kinds.in_place import InPlaceStep
from edgeseq.runtime.manifest import sha256_file
from edgeseq.runtime.search import GenerationOptions

TEXTS = ["abc", "jihgfedcba", "a", "bbbbbbbbbb", "cafe", "decade", "hij", "ab", "gggg", "fab"]


def test_export_proves_identical_ids_on_the_level3_inputs(export_case) -> None:
    """The export's parity group `top`: greedy and beam-4 ids on the top-k outputs equal the
    logits path's on every level-3 input (no near ties needed), scores within 1e-4."""
    group = export_case.manifest["parity"]["top"]
    assert group["passed"] and group["top_width"] == C.topk_width(
        export_case.model.cfg.tgt_vocab_size
    )
    for name in ("greedy", "beam"):
        entry = group[name]
        assert entry["identical"] == entry["inputs"] > 0 and entry["near_ties"] == 0
        assert entry["max_score_diff"] <= TOP_SCORE_TOLERANCE


def test_top_outputs_are_the_logits_top_k(export_case) -> None:
    """topk_ids/topk_logits are exactly the last position's largest logits (numpy's stable
    descending order); log_normalizer is float64's log(sum(exp(logit - max))) within 1e-6."""
    gen = Generator.load(export_case.bundle, threads=1, search="loop")
    step = gen.step_model
    sources = random_sources(export_case.model, 8)
    src = np.array([s + [step.pad_id] * (12 - len(s)) for s in sources if len(s) <= 12])
    state = step.start(src)
    ids = np.array([[step.bos_id, 5, 6]] * len(src), np.int64)  # new_len 3: last position read
    names = [C.LOGITS, *C.TOP_OUTPUTS]
    logits, top_ids, top_logits, lse = step.decoder.run(names, step.feeds(state, ids))
    last = logits[:, -1].astype(np.float64)
    order = np.argsort(-last, axis=1, kind="stable")[:, : step.top_width]
    assert np.array_equal(top_ids, order)
    assert np.array_equal(top_logits, np.take_along_axis(logits[:, -1], order, axis=1))
    want = np.log(np.exp(last - last.max(axis=1)[:, None]).sum(axis=1))
    assert np.abs(lse - want).max() < 1e-6


@pytest.mark.parametrize("beam_size", [1, 4])
def test_in_place_decoder_ids_identical_to_its_logits(in_place_bundle, beam_size) -> None:
    """The in-place decoder's top-k outputs (beam search's CPU path) give its logits path's
    hypotheses; greedy on decoder.onnx likewise (beam_size 1)."""
    gen = Generator.load(in_place_bundle, threads=1, search="loop")
    ref = gen.step_model
    model = InPlaceStep(ref.encoder, gen.in_place.decoder, gen.bundle.config)
    model = model if beam_size > 1 else ref
    sources = [list(gen.encode(t).ids) for t in TEXTS] + random_sources(
        SimpleNamespace(cfg=ref.config), 40
    )
    group = top_parity(model, sources, None)
    entry = group["beam" if beam_size > 1 else "greedy"]
    assert entry["identical"] == entry["inputs"] == len(sources)
    assert entry["max_score_diff"] <= TOP_SCORE_TOLERANCE
    assert model.top_width == C.topk_width(gen.bundle.config.tgt_vocab_size)


def test_a_bundle_without_the_outputs_decodes_through_the_logits(in_place_bundle, tmp_path) -> None:
    """decoder.onnx and decoder.inplace.onnx as exported before the outputs existed: the
    bundle loads, the step models read logits (top_width 0), the ids are the same."""
    old = tmp_path / "old"
    shutil.copytree(in_place_bundle, old)
    for name in (C.DECODER_FILE, C.IN_PLACE_FILES["fp32"]):
        model = onnx.load(str(old / name))
        strip_top_outputs(model.graph)
        onnx.save(model, str(old / name))
    manifest = json.loads((old / C.MANIFEST_FILE).read_text())
    for name, entry in manifest["files"].items():
        entry["sha256"], entry["bytes"] = sha256_file(old / name), (old / name).stat().st_size
    (old / C.MANIFEST_FILE).write_text(json.dumps(manifest))
    before = Generator.load(old, threads=1, search="loop")
    after = Generator.load(in_place_bundle, threads=1, search="loop")
    assert before.step_model.top_width == 0 and before.in_place.top_width == 0
    assert after.step_model.top_width > 0 and after.in_place.top_width > 0
    for options in (GenerationOptions(), GenerationOptions(beam_size=4, n_best=2)):
        want, got = before.generate(TEXTS, options), after.generate(TEXTS, options)
        for a, b in zip(want, got, strict=True):
            assert [c.token_ids for c in a.nbest] == [c.token_ids for c in b.nbest]
            assert np.allclose([c.score for c in a.nbest], [c.score for c in b.nbest], atol=1e-4)


def test_logits_path_restores_the_width(in_place_bundle) -> None:
    """`logits_path` hides the outputs only inside its block."""
    step = Generator.load(in_place_bundle, threads=1, search="loop").step_model
    width = step.top_width
    with logits_path(step):
        assert step.top_width == 0
    assert step.top_width == width > 0


def test_search_graph_drops_the_outputs(export_case, tmp_path: Path) -> None:
    """The BeamSearch decoder subgraph keeps the operator's interface (logits, present_*)."""
    from edgeseq.export.kinds.seq2seq.search_graph import decoder_subgraph

    decoder = onnx.load(str(export_case.bundle / C.DECODER_FILE))
    assert {o.name for o in decoder.graph.output} >= set(C.TOP_OUTPUTS)
    graph = decoder_subgraph(decoder, export_case.model.cfg)
    assert not {o.name for o in graph.output} & set(C.TOP_OUTPUTS)
    assert not [n for n in graph.node if n.name.startswith(C.TOP_NODE_PREFIX)]


def test_fp16_graphs_keep_the_outputs_in_float32(export_case, tmp_path: Path) -> None:
    """convert_fp16 keeps the search's outputs, computed in float32 from the float32 logits
    (the nodes kept in float32, no float16 round trip between them): the fp16 decoder's
    top-k ids and logits are exactly its own logits' largest, its log_normalizer float64's
    within 1e-6, and its logits those of a float32 output projection (not float16 values)."""
    import onnxruntime as ort

    from edgeseq.export.convert import convert_fp16

    target = tmp_path / "decoder.fp16.onnx"
    kept = convert_fp16(export_case.bundle / C.DECODER_FILE, target)
    assert any(name.startswith(C.TOP_NODE_PREFIX + "TopK") for name in kept)
    layers = export_case.model.cfg.n_decoder_layers
    graph = onnx.load(str(target)).graph
    assert [o.name for o in graph.output] == [*C.decoder_outputs(layers), *C.TOP_OUTPUTS]
    step = Generator.load(export_case.bundle, threads=1, search="loop").step_model
    sources = random_sources(export_case.model, 8)
    src = np.array([s + [step.pad_id] * (12 - len(s)) for s in sources if len(s) <= 12])
    ids = np.array([[step.bos_id, 5, 6]] * len(src), np.int64)  # new_len 3: last position read
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    feeds = step.feeds(step.start(src), ids)  # the fp32 graph's: the fp16 cache is float16
    feeds = {k: v.astype(np.float16) if C.is_cache(k) else v for k, v in feeds.items()}
    logits, top_ids, top_logits, lse = session.run([C.LOGITS, *C.TOP_OUTPUTS], feeds)
    last = logits[:, -1].astype(np.float64)
    assert not np.array_equal(last, last.astype(np.float16))  # float32 values
    order = np.argsort(-last, axis=1, kind="stable")[:, : step.top_width]
    assert np.array_equal(top_ids, order)
    assert np.array_equal(top_logits, np.take_along_axis(logits[:, -1], order, axis=1))
    want = np.log(np.exp(last - last.max(axis=1)[:, None]).sum(axis=1))
    assert np.abs(lse - want).max() < 1e-6


@pytest.mark.parametrize("vocab", [58101, 256206])
def test_log_normalizer_stays_near_float64s(vocab: int, tmp_path: Path) -> None:
    """At opus-mt's vocabulary (58,101: a float32 sum) and NLLB-200's (256,206: the sum in
    float64, FLOAT64_SUM_ROWS) the graph's normaliser stays within 2e-5 and 1e-6 of float64's
    log(sum(exp(logit - max))), over logits of scale 0.1 to 20 (a float32 sum of 256,206
    terms was 4e-5 off)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from edgeseq.export.top_outputs import FLOAT64_SUM_ROWS, add_top_outputs

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], [C.LOGITS])], "logits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [C.BATCH, "new", vocab])],
        [helper.make_tensor_value_info(C.LOGITS, TensorProto.FLOAT, [C.BATCH, "new", vocab])],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    add_top_outputs(proto, SimpleNamespace(tgt_vocab_size=vocab))
    float64 = vocab > FLOAT64_SUM_ROWS
    assert any(n.op_type == "Cast" for n in proto.graph.node) == float64
    path = tmp_path / "top.onnx"
    onnx.save(proto, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scales = np.array([0.1, 2.0, 5.0, 20.0])[:, None, None]
    logits = (np.random.default_rng(0).standard_normal((4, 2, vocab)) * scales).astype(np.float32)
    (lse,) = session.run([C.LOG_NORMALIZER], {"x": logits})
    last = logits[:, -1].astype(np.float64)
    want = np.log(np.exp(last - last.max(axis=1)[:, None]).sum(axis=1))
    assert np.abs(lse - want).max() < (1e-6 if float64 else 2e-5)
