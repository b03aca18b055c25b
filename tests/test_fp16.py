"""fp16 graphs (issue 53, item 3): every fp16 graph export writes opens in onnxruntime's CPU
provider, has a float16 cache (the encoder's cross K/V, the decoders' past/present/cross,
GPT's past_key_values/present) and float32 logits and search outputs, and generates greedy
and beam 4 through `Generator.load(..., variant="fp16")`: on the numpy path, the in-place
decoder, the IO-bound step models (on the CPU provider, the code CUDA runs) and the server's
live batch. LayerNormalization and Softmax are float16 unless the gate fails, when export
converts again with them in float32.

- The imported families' session fixtures (conftest.py: Marian, M2M-100 in NLLB layout,
  mBART-50, BART, T5 v1.1), copy-trained and exported with fp16 among their variants.
- An untrained M2M-100 import: its LayerNorm weights all hold ones and its biases zeros, so
  the exporter shares one initializer between the layers, which onnxruntime's float16
  converter once cast twice under one node name (a file onnxruntime refuses).
- GPT and BERT: conftest.py's trained checkpoints (`gpt_case`, `bert_case`) exported with
  fp16.
- conftest.py's tiny reversal model exported with fp32, fp16, steps and inplace
  (`fp16_bundle`): the extra decoders' fp16 files, the step models and the gate's fallback.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeseq.export.convert import FP16_KEPT_OPS, convert_fp16
from edgeseq.runtime import constants as C
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions, search

pytest.importorskip("torch")
HF_IMPORTS = ("marian_import", "m2m_import", "mbart50_import", "bart_import", "t5_import")
INPUTS = ["the house", "café"]
GREEDY_AND_BEAM = (GenerationOptions(), GenerationOptions(beam_size=4, n_best=2))
FLOAT, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
CPU = "CPUExecutionProvider"


def fp16_graphs(bundle: Path) -> list[Path]:
    """The fp16 graph files the bundle's manifest lists (every `.fp16.` file), checked
    against the `variants` table's fp16 entry."""
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    listed = sorted(name for name in manifest["files"] if ".fp16." in name)
    entry = manifest["variants"]["fp16"]
    roles = [entry[role] for role in ("encoder", "decoder", "model") if role in entry]
    assert set(roles) <= set(listed) and roles, (roles, listed)
    return [bundle / name for name in listed]


def io_types(path: Path) -> dict[str, int]:
    """{name: ONNX element type} of every input and output of graph `path`."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}


def check_io_types(path: Path) -> int:
    """The cache of fp16 graph `path` is float16 and every other input and output float32 or
    an integer/bool type (the logits, the search's outputs, `memory` float32); return the
    number of cache inputs and outputs."""
    types = io_types(path)
    cache = {name: t for name, t in types.items() if C.is_cache(name)}
    assert set(cache.values()) <= {FLOAT16}, (path.name, cache)
    others = {name: t for name, t in types.items() if not C.is_cache(name)}
    assert FLOAT16 not in others.values(), (path.name, others)
    for name in (C.LOGITS, C.TOPK_LOGITS, C.LOG_NORMALIZER, C.MEMORY, C.LAST_HIDDEN_STATE):
        assert others.get(name, FLOAT) == FLOAT, (path.name, name)
    return len(cache)


def check_fp16_bundle(bundle: Path, texts: list[str]) -> None:
    """Open every fp16 graph of `bundle` on the CPU provider and check its types, then
    generate `texts` with the fp16 variant, greedy and (but a classifier) beam 4."""
    caches = 0
    for path in fp16_graphs(bundle):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        caches += check_io_types(path)
    gen = Generator.load(bundle, variant="fp16", providers="cpu", threads=1)
    classifier = gen.config.architecture == C.ENCODER_ONLY
    assert caches > 0 or classifier
    searches = (None,) if classifier else GREEDY_AND_BEAM
    for options in searches:
        results = gen.generate(texts, options)
        assert len(results) == len(texts) and all(isinstance(r.text, str) for r in results)


@pytest.mark.parametrize("fixture", HF_IMPORTS)
def test_each_families_fp16_graphs_load_and_generate(fixture: str, request) -> None:
    case = request.getfixturevalue(fixture)
    check_fp16_bundle(case["bundle"], INPUTS)


@pytest.fixture(scope="module")
def untrained_m2m(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A random (untrained) tiny M2M-100 exported with fp32 and fp16, without the gate."""
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    pytest.importorskip("sentencepiece", reason="the hf extra is not installed")
    from click.testing import CliRunner
    from m2m_fixtures import build_m2m_dir

    from edgeseq.cli.main import cli

    root = tmp_path_factory.mktemp("untrained-m2m")
    source, bundle = build_m2m_dir(root / "m2m"), root / "bundle"
    argv = ["export", str(source), "--out", str(bundle), "--variants", "fp32,fp16", "--no-verify"]
    result = CliRunner().invoke(cli, argv)
    return {"bundle": bundle, "exit_code": result.exit_code, "output": result.output}


def test_shared_initializers_get_one_cast(untrained_m2m, tmp_path) -> None:
    assert untrained_m2m["exit_code"] == 0, untrained_m2m["output"]
    bundle = untrained_m2m["bundle"]
    fp32 = onnx.load(str(bundle / C.ENCODER_FILE))
    scales = Counter(n.input[1] for n in fp32.graph.node if n.op_type == "LayerNormalization")
    assert max(scales.values()) > 1  # the case: one initializer read by several LayerNorms
    for path in fp16_graphs(bundle):
        graph = onnx.load(str(path)).graph
        names = Counter(n.name for n in graph.node)
        outputs = Counter(o for n in graph.node for o in n.output)
        assert max(names.values()) == 1 and max(outputs.values()) == 1, path.name
    check_fp16_bundle(bundle, INPUTS)
    # the gate's fallback keeps the LayerNorms in float32: one Cast per shared weight
    kept = tmp_path / "encoder.kept.fp16.onnx"
    convert_fp16(bundle / C.ENCODER_FILE, kept, FP16_KEPT_OPS)
    graph = onnx.load(str(kept)).graph
    assert max(Counter(n.name for n in graph.node).values()) == 1
    ort.InferenceSession(str(kept), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("fixture", ["gpt_case", "bert_case"])
def test_gpt_and_bert_fp16_graphs_load_and_generate(fixture: str, request, tmp_path) -> None:
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import export_checkpoint
    from edgeseq.export.variants import VariantOptions

    case = request.getfixturevalue(fixture)
    variants = VariantOptions(("fp32", "fp16"), max_metric_drop=100.0)
    manifest = export_checkpoint(
        case["run"], tmp_path / "b", ExportOptions(inputs=20, variants=variants)
    )
    entry = manifest["variants"]["fp16"]
    assert entry["model"] == "model.fp16.onnx" and entry["precision"] == "fp16"
    assert entry["verified"] and entry["gate"]["passed"]
    assert "CUDA numerics not checked: " in entry["note"]
    check_fp16_bundle(tmp_path / "b", ["abc", "hello"])


def test_gpt_fp16_bound_step_equals_the_numpy_path(gpt_case, tmp_path) -> None:
    """GPT's IO-bound step (CUDA's code, on the CPU provider) keeps a float16 cache and gives
    the numpy path's ids."""
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import export_checkpoint
    from edgeseq.export.variants import VariantOptions
    from edgeseq.runtime.kinds.decoder_only import OrtBoundGPTStep, OrtGPTStep

    variants = VariantOptions(("fp32", "fp16"), max_metric_drop=100.0)
    export_checkpoint(
        gpt_case["run"], tmp_path / "b", ExportOptions(verify=False, variants=variants)
    )
    session = ort.InferenceSession(str(tmp_path / "b" / "model.fp16.onnx"), providers=[CPU])
    config = Generator.load(tmp_path / "b", providers="cpu").config
    numpy_step, bound_step = OrtGPTStep(session, config), OrtBoundGPTStep(session, config, "cpu")
    assert numpy_step.cache_dtype == np.float16
    prompts = np.array([[4, 5, 6], [7, 8, 0], [9, 0, 0]], dtype=np.int64)
    for options in GREEDY_AND_BEAM:
        got, want = search(bound_step, prompts, options), search(numpy_step, prompts, options)
        assert [[h.tokens for h in g] for g in got] == [[h.tokens for h in w] for w in want]
    _, state = bound_step.step(bound_step.start(prompts), np.ones((3, 1), np.int64))
    assert state.past_k[0].data_type() == "tensor(float16)"


# -- the reversal model with fp16, steps and inplace ------------------------------------------


@pytest.fixture(scope="module")
def fp16_bundle(runtime_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conftest.py's reversal model exported with fp32, fp16, steps and inplace (parity and
    gates on 24 random sources)."""
    from conftest import export_runtime_variants

    bundle = tmp_path_factory.mktemp("fp16") / "reverse-fp16"
    return export_runtime_variants(runtime_model, bundle, ("fp32", "fp16", "steps", "inplace"))


@pytest.fixture(scope="module")
def fp16_generator(fp16_bundle: Path) -> Generator:
    return Generator.load(fp16_bundle, variant="fp16", providers="cpu", threads=1)


def sources(generator: Generator) -> np.ndarray:
    """Right-padded source ids of a few reversal inputs, int64 (B, S)."""
    from edgeseq.runtime.padding import right_pad

    words = ["abc", "hgfedcba", "j", "abcdefgh", "ihg", "dd"]
    return right_pad([generator.encode(w).ids for w in words], generator.config.pad_id)


def test_extra_decoders_have_fp16_files_with_a_float16_cache(fp16_bundle: Path) -> None:
    manifest = json.loads((fp16_bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    for key, files in (("steps", C.STEPS_FILES), ("inplace", C.IN_PLACE_FILES)):
        assert manifest[key]["fp16"]["file"] == files["fp16"]
        types = io_types(fp16_bundle / files["fp16"])
        assert types["past_k.0"] == types["present_v.1"] == types["cross_k.0"] == FLOAT16
        assert types[C.LOGITS] == FLOAT
    assert manifest["parity"]["inplace"]["fp16"]["identical_rows"] > 0  # reported, not gated
    entry = manifest["variants"]["fp16"]
    assert entry["fp16"]["fp32_ops"] == [] and len(entry["fp16"]["search"]) == 1
    assert "CUDA numerics not checked" in entry["note"]
    check_fp16_bundle(fp16_bundle, ["abc", "jihgf"])


def test_fp16_numpy_and_in_place_paths_generate_greedy_and_beam(fp16_generator) -> None:
    """The numpy step model and the in-place decoder (CPU beam search) take the graphs'
    float16 cache; the in-place decoder's beam hypotheses are the loop's."""
    step_model, in_place = fp16_generator.step_model, fp16_generator.in_place
    assert type(step_model).__name__ == "OrtStep" and in_place is not None
    assert step_model.cache_dtype == in_place.cache_dtype == np.float16
    src = sources(fp16_generator)
    state = in_place.start(src)
    assert state.cache_k[0].dtype == np.float16 and state.cross_k[0].dtype == np.float16
    for options in GREEDY_AND_BEAM:
        want = search(step_model, src, options)
        got = search(in_place, src, options)
        assert [[h.tokens for h in g] for g in got] == [[h.tokens for h in w] for w in want]
        results = fp16_generator.generate(["abc", "hgfed"], options)
        assert len(results) == 2 and all(r.text and r.finished for r in results)


def test_fp16_bound_step_equals_the_numpy_path(fp16_bundle: Path) -> None:
    """`OrtBoundStep` (CUDA's code, on the CPU provider) with the fp16 graphs: a float16 cache
    as OrtValues, the numpy path's ids, greedy and beam 4."""
    from edgeseq.runtime.kinds.ort_step import OrtStep
    from edgeseq.runtime.kinds.seq2seq import OrtBoundStep

    generator = Generator.load(fp16_bundle, variant="fp16", providers="cpu", threads=1)
    encoder, decoder = (
        ort.InferenceSession(str(path), providers=[CPU]) for path in generator.bundle.graphs("fp16")
    )
    cfg = generator.config
    numpy_step, bound_step = (
        OrtStep(encoder, decoder, cfg),
        OrtBoundStep(encoder, decoder, cfg, "cpu"),
    )
    src = sources(generator)
    for options in GREEDY_AND_BEAM:
        got, want = search(bound_step, src, options), search(numpy_step, src, options)
        assert [[h.tokens for h in g] for g in got] == [[h.tokens for h in w] for w in want]
    state = bound_step.start(src)
    assert state.past_k[0].dtype == np.float16  # the empty cache, on the host
    _, state = bound_step.step(state, np.ones((len(src), 1), np.int64))
    assert state.past_k[0].data_type() == state.cross_v[1].data_type() == "tensor(float16)"


@pytest.mark.parametrize("where", ["host", "device"])
def test_the_live_batch_runs_the_fp16_steps_decoder(fp16_generator, where: str) -> None:
    """The server's live batch on the fp16 steps graph: K/V float16 on the host (numpy) and
    as OrtValues (DeviceTensors, CUDA's code, on the CPU provider); two rows joining at
    different steps get the logits each gets alone through decoder.fp16.onnx."""
    from edgeseq.runtime.serve.continuous import steps_decoder
    from edgeseq.runtime.serve.live_batch import DeviceTensors, HostTensors, LiveBatch

    steps = steps_decoder(fp16_generator, "step")
    assert steps is not None and steps.cache_dtype == np.float16
    words = [fp16_generator.encode(w).ids for w in ("abcdefgh", "hij")]
    alone = []
    for source in words:
        state, last, logits = fp16_generator.step_model.start(np.array([source])), 1, []
        for _ in range(5):
            out, state = fp16_generator.step_model.step(state, np.array([[last]]))
            logits.append(out[0, -1])
            last = int(out[0, -1].argmax())
        alone.append(logits)
    tensors = DeviceTensors(steps, "cpu") if where == "device" else HostTensors()
    batch, join = LiveBatch(steps, tensors), [0, 2]
    slot_of: dict[int, int] = {}
    last: dict[int, int] = {}
    for t in range(5):
        new = [r for r, j in enumerate(join) if j == t]
        slot_of |= dict(zip(new, batch.join([words[r] for r in new]), strict=True))
        last |= {r: 1 for r in new}
        ids = np.zeros(batch.rows, np.int64)
        for r, slot in slot_of.items():
            ids[slot] = last[r]
        logits = batch.step(ids)
        assert logits.dtype == np.float32
        for r, slot in slot_of.items():
            np.testing.assert_allclose(logits[slot], alone[r][t - join[r]], atol=2e-3)
            last[r] = int(logits[slot].argmax())
    kv = batch.past_k[0]
    dtype = kv.dtype if isinstance(kv, np.ndarray) else kv.data_type()
    assert dtype in (np.float16, "tensor(float16)")


# -- the gate's fallback: LayerNormalization and Softmax in float32 ----------------------------
def layer_norms_read_float32(path: Path) -> bool:
    """Whether every LayerNormalization of graph `path` reads a Cast to float32 (the float32
    conversion), else False (none does: float16)."""
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    reads = []
    for node in graph.node:
        if node.op_type == "LayerNormalization":
            cast = producer.get(node.input[0])
            to = [a.i for a in cast.attribute if a.name == "to"] if cast is not None else []
            reads.append(cast is not None and cast.op_type == "Cast" and to == [FLOAT])
    assert reads and (all(reads) or not any(reads)), reads
    return all(reads)


def test_a_missed_fp16_gate_converts_again_with_float32_norms(
    fp16_bundle: Path, runtime_model, tmp_path, monkeypatch
) -> None:
    """The first gate (every operator in float16) forced to miss: export converts again with
    FP16_KEPT_OPS in float32, gates that, and records it; when that misses too, GateError
    carries both rows."""
    import shutil

    from edgeseq.export.gate import GateError
    from edgeseq.export.heldout import HeldOut
    from edgeseq.export.kinds.seq2seq import precisions
    from edgeseq.export.parity import random_sources

    assert not layer_norms_read_float32(fp16_bundle / "decoder.fp16.onnx")  # the default
    directory = tmp_path / "b"
    shutil.copytree(fp16_bundle, directory)
    cfg = Generator.load(directory, providers="cpu").config
    held = HeldOut(random_sources(runtime_model.model, 8), None, "random sources")
    ref = precisions.fp32_reference(directory, cfg, runtime_model.tokenizers, held, 10)
    real_gate, calls = precisions.Reference.gate, []

    def first_misses(self, engine, max_drop):
        numbers = real_gate(self, engine, max_drop)
        calls.append(numbers)
        return numbers | {"passed": numbers["passed"] and len(calls) > 1}

    monkeypatch.setattr(precisions.Reference, "gate", first_misses)
    lines: list[str] = []
    entry = precisions.build_fp16(directory, cfg, ref, 100.0, lines.append)
    assert entry["fp16"]["fp32_ops"] == list(FP16_KEPT_OPS) and entry["gate"]["passed"]
    search_rows = entry["fp16"]["search"]
    assert [row["fp32_ops"] for row in search_rows] == [[], list(FP16_KEPT_OPS)]
    assert [row["passed"] for row in search_rows] == [False, True]
    assert any("misses the gate" in line for line in lines)
    for name in ("encoder.fp16.onnx", "decoder.fp16.onnx"):
        assert layer_norms_read_float32(directory / name)
        check_io_types(directory / name)  # the cache stays float16
    with pytest.raises(GateError, match="even with Softmax, LayerNormalization in float32") as err:
        precisions.build_fp16(directory, cfg, ref, -1.0, lines.append)  # no drop passes
    assert [row["fp32_ops"] for row in err.value.attempts] == [[], list(FP16_KEPT_OPS)]


def test_one_graph_fp16_falls_back_to_float32_norms(gpt_case, tmp_path) -> None:
    """GPT/BERT's fp16 entry (export/kinds/one_graph.py): a miss converts again with
    FP16_KEPT_OPS in float32; two misses raise GateError with both rows."""
    import shutil

    from edgeseq.export.gate import GateError
    from edgeseq.export.kinds.one_graph import fp16_entry

    shutil.copy(gpt_case["bundle"] / C.MODEL_FILE, tmp_path / C.MODEL_FILE)
    tried: list[bool] = []

    def gated(name: str, entry: dict[str, Any]) -> dict[str, Any]:
        tried.append(layer_norms_read_float32(tmp_path / "model.fp16.onnx"))
        passed = len(tried) > 1 and pass_second
        gate = {"metric": "agreement", "fp32": 1.0, "variant": 0.5, "drop_points": 50.0,
                "max_drop_points": 1.0, "agreement": 0.5, "passed": passed}  # fmt: skip
        return entry | {"gate": gate, "verified": passed}

    pass_second = True
    entry = fp16_entry(tmp_path, gated, lambda _: None)
    assert tried == [False, True] and entry["fp16"]["fp32_ops"] == list(FP16_KEPT_OPS)
    assert [row["passed"] for row in entry["fp16"]["search"]] == [False, True]
    assert "CUDA numerics not checked" in entry["note"]
    check_io_types(tmp_path / "model.fp16.onnx")
    tried.clear()
    pass_second = False
    with pytest.raises(GateError, match="fp16 misses the accuracy gate even with") as err:
        fp16_entry(tmp_path, gated, lambda _: None)
    assert [row["fp32_ops"] for row in err.value.attempts] == [[], list(FP16_KEPT_OPS)]
