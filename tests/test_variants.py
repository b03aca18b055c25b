"""Edge variants (issue 6): int8 / fp16 / ORT-format graphs behind accuracy gates.

One CLI export of the trained tiny model (conftest's `runtime_model`, saved as a checkpoint
whose task is a tsv corpus of its own mapping, so the gate has real references) with every
variant, shared by the module; the gate-failure cases re-run `build_variants` on copies of
its fp32 graphs, which costs no torch export.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from edgeseq.cli.inspect import inspect_bundle
from edgeseq.cli.main import cli, main
from edgeseq.export.report import format_attempts
from edgeseq.runtime import constants as C
from edgeseq.runtime.errors import BundleError, OptionsError
from edgeseq.runtime.generator import Generator

pytest.importorskip("torch")
from edgeseq.build_model.checkpoint import save_checkpoint
from edgeseq.export import gate as G
from edgeseq.export import variants as V
from edgeseq.export.convert import GraphLoadError
from edgeseq.export.heldout import HeldOut
from edgeseq.export.kinds.seq2seq import precisions as P
from edgeseq.export.quantize import OUTPUT_GROUP, graph_groups, weight_nodes

ALL = ("fp32", "int8", "fp16", "ort")
INPUTS = 50


def _corpus(path: Path, n: int = 800) -> Path:
    """A tsv of the runtime model's mapping: letters a..j -> reversed and upper-cased."""
    rng = random.Random(0)
    words = {"".join(rng.choices("abcdefghij", k=rng.randint(1, 8))) for _ in range(n)}
    path.write_text("".join(f"{w}\t{w[::-1].upper()}\n" for w in sorted(words)))
    return path


@pytest.fixture(scope="module")
def exported(runtime_model, tmp_path_factory: pytest.TempPathFactory):
    """(checkpoint, bundle, CLI output) of `edgeseq export --variants fp32,int8,fp16,ort`."""
    root = tmp_path_factory.mktemp("variants")
    task = {"name": "tsv", "options": {"path": str(_corpus(root / "reverse.tsv"))}}
    ckpt = save_checkpoint(
        root / "ckpt", runtime_model.model, runtime_model.tokenizers, task, {"step": 150}
    )
    bundle = root / "bundle"
    argv = ["export", str(ckpt), "--out", str(bundle), "--variants", ",".join(ALL)]
    result = CliRunner().invoke(cli, [*argv, "--inputs", str(INPUTS)])
    assert result.exit_code == 0, result.output
    return ckpt, bundle, result.output


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / C.MANIFEST_FILE).read_text())


def test_every_variant_generates_through_the_same_runtime(exported) -> None:
    _, bundle, _ = exported
    texts = ["abc", "jihgfedc", "cafe", "j", "bead", "hig"]
    outputs = {}
    for variant in ALL:
        gen = Generator.load(bundle, providers="cpu", threads=1, variant=variant)
        outputs[variant] = [r.text for r in gen.generate(texts)]
    assert outputs["fp32"][0] == "CBA"
    assert outputs["ort"] == outputs["fp32"]  # the same graphs, optimized and serialized
    for variant in ("int8", "fp16"):
        same = sum(a == b for a, b in zip(outputs[variant], outputs["fp32"], strict=True))
        assert same >= len(texts) - 1, (variant, outputs[variant], outputs["fp32"])


def test_manifest_lists_each_variant_with_files_sizes_gate_and_speed(exported) -> None:
    _, bundle, output = exported
    manifest = _manifest(bundle)
    table = manifest["variants"]
    assert sorted(table) == sorted(ALL)
    for name, entry in table.items():
        for graph in ("encoder", "decoder"):
            assert entry[graph] in manifest["files"], (name, graph)
        size = sum(manifest["files"][entry[g]]["bytes"] for g in ("encoder", "decoder"))
        assert entry["bytes"] == size
        assert entry["speed"]["tokens_per_second"] > 0 and entry["speed"]["batch"] == 1
        assert entry["verified"] is True
        if name != "fp32":
            gate = entry["gate"]
            assert gate["passed"] and gate["metric"] == "exact_match"
            assert gate["inputs"] == INPUTS and gate["source"].startswith("task tsv")
    assert table["int8"]["size_ratio"] < 0.75  # embeddings and logits stay fp32 here
    weights = {  # a model this small is mostly graph structure: compare the weights
        name: sum(len(i.raw_data) for i in onnx.load(str(bundle / name)).graph.initializer)
        for name in (C.DECODER_FILE, table["fp16"]["decoder"])
    }
    assert weights[table["fp16"]["decoder"]] < 0.6 * weights[C.DECODER_FILE]
    assert table["ort"]["format"] == "ort" and table["ort"]["encoder"] == "encoder.ort"
    config = (bundle / table["ort"]["required_operators"]).read_text()
    assert "ai.onnx;13;" in config and "MatMul" in config
    assert "# - decoder.ort\n# - encoder.ort\n" in config  # no temporary paths
    for text in ("int8", "fp16", "ort", "tokens/s", "exact_match fp32->variant", "gate:"):
        assert text in output, text


def test_int8_weights_use_seven_bits(exported) -> None:
    """reduce_range: |w| <= 64 in every int8 weight, so uint8 x int8 pairs summed in int16
    (x86 without VNNI) cannot saturate wherever the bundle runs."""
    _, bundle, _ = exported
    table = _manifest(bundle)["variants"]
    weights = [
        onnx.numpy_helper.to_array(init)
        for graph in ("encoder", "decoder")
        for init in onnx.load(str(bundle / table["int8"][graph])).graph.initializer
        if init.data_type == onnx.TensorProto.INT8
    ]
    assert weights and max(int(abs(w.astype(int)).max()) for w in weights) <= 64


def test_int8_weight_bits_8_uses_the_full_range_and_warns_without_vnni(
    exported, tmp_path, caplog
) -> None:
    """--int8-weight-bits 8: weights past 64 in magnitude, `reduce_range` false in the
    manifest (the inplace decoder quantized likewise); loading the int8 variant on an x86
    CPU without VNNI warns, with VNNI or on ARM64 it does not."""
    from edgeseq.runtime.cpu_features import saturation_warning

    ckpt, _, _ = exported
    bundle = tmp_path / "b8"
    argv = ["export", str(ckpt), "--out", str(bundle), "--variants", "fp32,int8,inplace"]
    result = CliRunner().invoke(cli, [*argv, "--inputs", "20", "--int8-weight-bits", "8"])
    assert result.exit_code == 0, result.output
    manifest = _manifest(bundle)
    assert manifest["variants"]["int8"]["quantization"]["reduce_range"] is False
    assert "variant int8 (verified, 8-bit weights):" in inspect_bundle(bundle)[0]
    assert "variant int8 (verified, 7-bit weights):" in inspect_bundle(exported[1])[0]
    for name in (manifest["variants"]["int8"]["decoder"], C.IN_PLACE_FILES["int8"]):
        weights = [
            onnx.numpy_helper.to_array(init)
            for init in onnx.load(str(bundle / name)).graph.initializer
            if init.data_type == onnx.TensorProto.INT8
        ]
        assert max(int(abs(w.astype(int)).max()) for w in weights) > 64
    avx2 = frozenset({"avx2", "fma"})
    assert "--int8-weight-bits 8" in saturation_warning(manifest, "int8", "x86_64", avx2)
    assert saturation_warning(manifest, "int8", "x86_64", avx2 | {"avx512_vnni"}) is None
    assert saturation_warning(manifest, "int8", "aarch64", None) is None
    assert saturation_warning(manifest, "fp32", "x86_64", avx2) is None
    assert saturation_warning(_manifest(exported[1]), "int8", "x86_64", avx2) is None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("edgeseq.runtime.cpu_features.cpu_flags", lambda: avx2)
        patch.setattr("edgeseq.runtime.cpu_features.platform.machine", lambda: "x86_64")
        Generator.load(bundle, threads=1, variant="int8")
    assert any("saturate" in record.getMessage() for record in caplog.records)
    with pytest.raises(SystemExit):
        cli.main([*argv, "--int8-weight-bits", "6"], standalone_mode=True)


def test_int8_agreement_and_metric_are_measured_on_the_trained_model(exported) -> None:
    _, bundle, _ = exported
    table = _manifest(bundle)["variants"]
    fp32, gate = table["fp32"]["scores"], table["int8"]["gate"]
    assert fp32["exact_match"] > 0.5  # trained: the metric means something
    assert gate["fp32"] == fp32["exact_match"]
    assert gate["agreement"] >= 0.9
    assert gate["drop_points"] == pytest.approx(100 * (gate["fp32"] - gate["variant"]), abs=1e-3)
    quantization = table["int8"]["quantization"]
    assert quantization["quantized_nodes"] > 0 and quantization["excluded_groups"] == []
    assert quantization["reduce_range"] is True
    decoder = onnx.load(str(bundle / table["int8"]["decoder"]))
    ops = {n.name: n.op_type for n in decoder.graph.node}
    assert "MatMulInteger" in ops.values()
    assert quantization["fp32_nodes"] == []  # the output projection too, by default


def _fp32_copy(bundle: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "graphs"
    directory.mkdir()
    for name in P.GRAPH_FILES["fp32"]:
        shutil.copy(bundle / name, directory / name)
    return directory


def _held(gen: Generator, n: int = 24) -> HeldOut:
    rng = random.Random(1)
    texts = ["".join(rng.choices("abcdefghij", k=rng.randint(1, 8))) for _ in range(n)]
    sources = [list(gen.encode(t).ids) for t in texts]
    refs = [[t[::-1].upper()] for t in texts]
    return HeldOut(sources, texts, "test inputs", references=refs, target_chars=True)


def test_the_gate_trips_with_the_table_of_what_was_tried(exported, tmp_path) -> None:
    _, bundle, _ = exported
    gen = Generator.load(bundle, providers="cpu", threads=1)
    directory = _fp32_copy(bundle, tmp_path)
    options = V.VariantOptions(("fp32", "int8"), max_metric_drop=-101.0, speed_inputs=2)
    with pytest.raises(G.GateError, match="int8 misses the accuracy gate even with every") as e:
        P.build_variants(
            directory, gen.config, gen.tokenizers, _held(gen), options, fp32_verified=True
        )
    groups = graph_groups(*(onnx.load(str(directory / f)) for f in P.GRAPH_FILES["fp32"]))
    layers = ["encoder layer 0", "encoder layer 1", "decoder layer 0", "decoder layer 1"]
    assert groups == [*layers, OUTPUT_GROUP]
    attempts = e.value.attempts
    assert len(attempts) == 1 + 5 + 4 + 3 + 2 + 1  # nothing excluded, then one more per round
    assert attempts[0]["excluded_groups"] == [] and not any(a["passed"] for a in attempts)
    assert sorted(attempts[-1]["excluded_groups"]) == sorted(groups)
    table = format_attempts(attempts)
    assert "kept in fp32" in table and "decoder layer 1" in table and "FAIL" in table


def _duplicate_first_node(graph: onnx.GraphProto) -> int:
    """A stand-in for `merge_duplicate_casts` that adds what it removes: a second node with
    the first node's name and output, which onnxruntime refuses."""
    graph.node.append(graph.node[0])
    return 0


def test_an_fp16_graph_onnxruntime_cannot_load_fails_build_variants(
    exported, tmp_path, monkeypatch
) -> None:
    _, bundle, _ = exported
    gen = Generator.load(bundle, providers="cpu", threads=1)
    directory = _fp32_copy(bundle, tmp_path)
    monkeypatch.setattr("edgeseq.export.convert.merge_duplicate_casts", _duplicate_first_node)
    options = V.VariantOptions(("fp32", "fp16"), speed_inputs=2)
    with pytest.raises(GraphLoadError, match=r"fp16 graph encoder\.fp16\.onnx does not load.*"):
        P.build_variants(
            directory, gen.config, gen.tokenizers, _held(gen), options, fp32_verified=True
        )


def test_an_unloadable_fp16_graph_fails_the_export_with_one_line(
    exported, tmp_path, monkeypatch, capsys
) -> None:
    ckpt, _, _ = exported
    monkeypatch.setattr("edgeseq.export.convert.merge_duplicate_casts", _duplicate_first_node)
    argv = ["export", str(ckpt), "--out", str(tmp_path / "b"), "--variants", "fp32,fp16"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--no-verify"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the fp16 graph encoder.fp16.onnx")
    assert "does not load in onnxruntime" in err[0] and "two nodes with same node name" in err[0]
    assert not (tmp_path / "b").exists()  # nothing written


def test_fp16_manifest_entry_is_honest(exported) -> None:
    entry = _manifest(exported[1])["variants"]["fp16"]
    assert entry["verified"] and entry["gate"]["passed"]
    assert entry["gate"]["provider"] == "CPUExecutionProvider"
    assert "CUDA numerics not checked: " in entry["note"]
    # float16 LayerNorm and Softmax passed the gate: none kept in float32 (tests/test_fp16.py
    # forces the fallback)
    assert entry["fp16"]["fp32_ops"] == [] and entry["fp16"]["search"][0]["passed"]


def test_int8_quantizes_the_output_projection_unless_excluded(exported, tmp_path) -> None:
    from edgeseq.export.quantize import quantize_graph

    _, bundle, _ = exported
    source = bundle / C.DECODER_FILE
    logits = [n.name for n in weight_nodes(onnx.load(str(source))) if n.group == OUTPUT_GROUP]
    assert len(logits) == 1
    default = quantize_graph(source, tmp_path / "d.onnx")
    kept = quantize_graph(source, tmp_path / "kept.onnx", exclude=[OUTPUT_GROUP])
    assert default["kept"] == [] and kept["kept"] == logits
    assert len(default["quantized"]) == len(kept["quantized"]) + 1
    assert OUTPUT_GROUP in graph_groups(onnx.load(str(source)))
    manifest = _manifest(bundle)["variants"]["int8"]["quantization"]
    assert manifest["kept_fp32"] == ["embeddings", "positional table"]


def test_a_transposed_weight_is_folded_so_the_quantizer_sees_it(tmp_path) -> None:
    """A tied output projection exports as MatMul(x, Transpose(W)): folded into a (D, V)
    initializer, quantized, and the graph computes what it did."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgeseq.export.quantize import fold_weight_transposes, quantize_graph

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(40, 16)).astype(np.float32)  # (V, D), as an embedding
    nodes = [
        helper.make_node("Transpose", ["W"], ["W_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "W_t"], [C.LOGITS], name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info(C.LOGITS, TensorProto.FLOAT, ["n", 40])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    assert [n.group for n in weight_nodes(model)] == []  # the weight is not an initializer
    folded = fold_weight_transposes(onnx.ModelProto.FromString(model.SerializeToString()))
    assert [n.op_type for n in folded.graph.node] == ["MatMul"]
    assert [i.name for i in folded.graph.initializer] == ["W_t"]  # W is read by nothing now
    assert [n.group for n in weight_nodes(folded)] == [OUTPUT_GROUP]
    onnx.save(model, tmp_path / "head.onnx")
    nodes_done = quantize_graph(tmp_path / "head.onnx", tmp_path / "head.int8.onnx")
    assert nodes_done == {"quantized": ["head"], "kept": []}
    x = rng.normal(size=(3, 16)).astype(np.float32)
    run = ort.InferenceSession(str(tmp_path / "head.int8.onnx"), providers=["CPUExecutionProvider"])
    (got,) = run.run(None, {"x": x})
    assert np.abs(got - x @ weight.T).max() < 0.2  # int8 weights, same function


def test_a_bundle_without_the_variant_refuses_it(runtime_case, capsys) -> None:
    with pytest.raises(BundleError, match=r"has no variant 'int8'; it has fp32"):
        Generator.load(runtime_case.bundle, providers="cpu", variant="int8")
    argv = ["generate", str(runtime_case.bundle), "abc", "--provider", "cpu", "--variant", "int8"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "has no variant 'int8'; it has fp32" in err
    assert "--variants" in err  # says how to get it


def test_parse_variants() -> None:
    assert V.parse_variants("int8, ort") == ("fp32", "int8", "ort")
    assert V.parse_variants("ort,fp32,int8,int8") == ("fp32", "int8", "ort")
    with pytest.raises(OptionsError, match=r"unknown variant.*int4.*choose from fp32, int8"):
        V.parse_variants("int4")


def test_inspect_shows_the_variants_table(exported) -> None:
    text, bad = inspect_bundle(exported[1])
    assert bad == []
    assert "variants (measured at export):" in text
    assert "encoder.ort" in text and "int8" in text and "gate:" in text
