"""fp16 graphs that load (issue 53, item 3): every fp16 graph export writes opens in
onnxruntime's CPU provider and generates through `Generator.load(..., variant="fp16")`.

- The imported families' session fixtures (conftest.py: Marian, M2M-100 in NLLB layout,
  mBART-50, BART, T5 v1.1), copy-trained and exported with fp16 among their variants.
- An untrained M2M-100 import: its LayerNorm weights all hold ones and its biases zeros, so
  the exporter shares one initializer between the layers, which onnxruntime's float16
  converter once cast twice under one node name (a file onnxruntime refuses).
- GPT and BERT: conftest.py's trained checkpoints (`gpt_case`, `bert_case`) exported with
  fp16.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest

from edgeseq.runtime import constants as C
from edgeseq.runtime.generator import Generator

pytest.importorskip("torch")
HF_IMPORTS = ("marian_import", "m2m_import", "mbart50_import", "bart_import", "t5_import")
INPUTS = ["the house", "café"]


def fp16_graphs(bundle: Path) -> list[Path]:
    """The fp16 graph files the bundle's manifest lists (every `.fp16.` file), checked
    against the `variants` table's fp16 entry."""
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    listed = sorted(name for name in manifest["files"] if ".fp16." in name)
    entry = manifest["variants"]["fp16"]
    roles = [entry[role] for role in ("encoder", "decoder", "model") if role in entry]
    assert set(roles) <= set(listed) and roles, (roles, listed)
    return [bundle / name for name in listed]


def check_fp16_bundle(bundle: Path, texts: list[str]) -> None:
    """Open every fp16 graph of `bundle` on the CPU provider, then generate `texts` with the
    fp16 variant."""
    for path in fp16_graphs(bundle):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    gen = Generator.load(bundle, variant="fp16", providers="cpu", threads=1)
    results = gen.generate(texts)
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


def test_shared_initializers_get_one_cast(untrained_m2m) -> None:
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
