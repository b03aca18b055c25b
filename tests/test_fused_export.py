"""The fused export (default) and the standard-operator one (`--no-fuse`): which operators
each graph holds, parity for both, the same outputs, and the onnxruntime each needs."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import onnx
import pytest

from edgeseq.export.fused_ops import FUSED_OP, MS_DOMAIN
from edgeseq.export.kinds.seq2seq.bundle import export_bundle
from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import version_key
from edgeseq.runtime.generator import Generator

pytestmark = pytest.mark.usefixtures("one_torch_thread")
WORDS = ["abc", "hgfedcba", "j", "abcabcab", "jihg", "a"]


def _ops(path: Path) -> Counter:
    return Counter((node.domain or "ai.onnx", node.op_type) for node in onnx.load(path).graph.node)


@pytest.fixture(scope="module")
def bundles(runtime_model, tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """runtime_model exported fused and unfused, both with parity and int8."""
    from edgeseq.export.variants import VariantOptions

    out = {}
    for fuse in (True, False):
        path = tmp_path_factory.mktemp("fused") / f"fuse-{fuse}"
        export_bundle(
            runtime_model.model, runtime_model.tokenizers, path,
            variants=VariantOptions(("fp32", "int8")), fuse=fuse,
        )  # fmt: skip
        out[fuse] = path
    return out


def test_default_graphs_hold_fused_attention(bundles: dict[bool, Path]) -> None:
    """A silent fallback to unfused graphs fails here: every attention is one node."""
    layers = 2
    for name, attentions in ((C.ENCODER_FILE, layers), (C.DECODER_FILE, 2 * layers)):
        for variant in ("", ".int8"):
            file = name.replace(".onnx", f"{variant}.onnx")
            ops = _ops(bundles[True] / file)
            assert ops[(MS_DOMAIN, FUSED_OP)] == attentions, (file, ops)
            assert ops[("ai.onnx", "Softmax")] == 0
    manifest = Generator.load(bundles[True], providers="cpu").bundle.manifest
    assert version_key(manifest["min_onnxruntime"]) >= version_key(C.MIN_ORT_FUSED_ATTENTION)
    assert manifest["parity"]["passed"] and manifest[C.MANIFEST_FUSED_ATTENTION] is True


def test_no_fuse_exports_standard_operators_with_parity(bundles: dict[bool, Path]) -> None:
    for file in (C.ENCODER_FILE, C.DECODER_FILE):
        domains = {domain for domain, _ in _ops(bundles[False] / file)}
        assert domains == {"ai.onnx"}, (file, domains)
    manifest = Generator.load(bundles[False], providers="cpu").bundle.manifest
    assert manifest["parity"]["passed"] and manifest["variants"]["int8"]["gate"]["passed"]
    assert version_key(manifest["min_onnxruntime"]) < version_key(C.MIN_ORT_FUSED_ATTENTION)
    assert manifest[C.MANIFEST_FUSED_ATTENTION] is False


def test_pyproject_accepts_the_unfused_floor_not_the_fused_one(bundles: dict[bool, Path]) -> None:
    """What pyproject.toml accepts runs a --no-fuse bundle, and fused attention needs more:
    so the refusal of a fused bundle on an older onnxruntime (naming --no-fuse) is the way
    there, as docs/export.md says."""
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    floors = set(re.findall(r'"onnxruntime(?:-gpu)?>=([\d.]+)', text))
    assert len(floors) == 1, floors  # onnxruntime-gpu and onnxruntime alike
    accepted = version_key(floors.pop())
    accepted += (0,) * (3 - len(accepted))  # ">=1.18" is 1.18.0
    unfused = Generator.load(bundles[False], providers="cpu").bundle.manifest
    assert version_key(unfused["min_onnxruntime"]) <= accepted
    assert accepted < version_key(C.MIN_ORT_FUSED_ATTENTION)


def test_fused_and_unfused_generate_the_same(bundles: dict[bool, Path]) -> None:
    fused = Generator.load(bundles[True], providers="cpu", threads=1, search="loop")
    plain = Generator.load(bundles[False], providers="cpu", threads=1, search="loop")
    assert [r.text for r in fused.generate(WORDS)] == [r.text for r in plain.generate(WORDS)]
