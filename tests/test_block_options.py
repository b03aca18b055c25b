"""The block options `norm_type: "rms"`, `ffn: "gated"`, `head_dim` (T5 v1.1's RMS norm,
gated feed-forward and heads wider than d_model / n_heads) and `embedding_norm` (BART's
layernorm_embedding): config.json unchanged at the defaults, the refusals, the arithmetic of
docs/blocks.md, and a model trained a few steps by a recipe with them, exported fused (with
the int8, in-place and steps variants) and unfused,
parity levels 1-3 and generation."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from edgeseq.build_model.checkpoint import load_checkpoint
from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.build_model.sublayers import GatedFeedForward, RMSNorm
from edgeseq.build_model.train import Recipe, train
from edgeseq.export.fused_ops import FUSED_OP, MS_DOMAIN
from edgeseq.export.kinds.seq2seq.bundle import export_bundle
from edgeseq.export.variants import VariantOptions
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import ConfigError
from edgeseq.runtime.generator import Generator

pytestmark = pytest.mark.usefixtures("one_torch_thread")
OPTIONS = dict(norm="pre", norm_type="rms", ffn="gated", activation="gelu-tanh", dropout=0.0)
OPTIONS |= {"embedding_norm": True}
OPTIONS |= dict(head_dim=16)  # 4 heads of 16 on d_model 32, as Flan-T5-small's 6 x 64 on 512
WORDS = ["abc", "fedcba", "a", "cabbac", "bb"]


def test_defaults_leave_config_json_as_it_was_and_options_round_trip() -> None:
    plain = ModelConfig(src_vocab_size=10, tgt_vocab_size=12)
    assert not {"norm_type", "ffn", "embedding_norm", "head_dim"} & set(plain.to_dict())
    t5 = ModelConfig(src_vocab_size=10, tgt_vocab_size=12, norm_type="rms", ffn="gated")
    assert t5.to_dict()["norm_type"] == "rms" and t5.to_dict()["ffn"] == "gated"
    assert ModelConfig.from_json(t5.to_json()) == t5
    bart = ModelConfig(src_vocab_size=10, tgt_vocab_size=12, embedding_norm=True)
    assert bart.to_dict()["embedding_norm"] is True
    assert ModelConfig.from_json(bart.to_json()) == bart
    assert "norm_type" not in ModelConfig.from_json(plain.to_json()).to_dict()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"norm_type": "batch"}, "norm_type must be one of layer, rms; got 'batch'"),
        ({"ffn": "glu"}, "ffn must be one of plain, gated; got 'glu'"),
        ({"activation": "gelu_new"}, "activation must be one of relu, gelu, gelu-tanh, silu"),
        ({"norm_type": "rms", "architecture": "decoder-only"}, "norm_type apply to the encoder"),
        ({"embedding_norm": 1}, "embedding_norm must be true or false, got 1"),
        ({"embedding_norm": True, "architecture": "encoder-only"}, "embedding_norm apply to"),
        ({"head_dim": 0}, "head_dim must be a positive integer or null, got 0"),
        ({"head_dim": 8, "architecture": "encoder-only"}, "head_dim apply to the encoder-decoder"),
    ],
)
def test_bad_block_options_are_refused_naming_the_field(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelConfig(src_vocab_size=12, tgt_vocab_size=12, **options).validate()
    with pytest.raises(ConfigError, match=match):
        Recipe.from_dict({"d_model": 32, "n_heads": 4, **options})


def test_rms_norm_and_gated_ffn_compute_the_documented_formulas() -> None:
    """docs/blocks.md's numpy, against the torch modules."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    norm = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    xn, w = x.numpy().astype(np.float64), norm.weight.detach().numpy()
    want = xn / np.sqrt(np.mean(xn**2, axis=-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(norm(x).detach().numpy(), want, atol=1e-5)

    ffn = GatedFeedForward(8, 16, dropout=0.0, activation="silu").eval()
    for linear in (ffn.w_1, ffn.w_2, ffn.w_3):
        torch.nn.init.normal_(linear.bias)
    p = {n: v.detach().numpy().astype(np.float64) for n, v in ffn.named_parameters()}
    gate = xn @ p["w_1.weight"].T + p["w_1.bias"]
    hidden = gate / (1 + np.exp(-gate)) * (xn @ p["w_3.weight"].T + p["w_3.bias"])
    want = hidden @ p["w_2.weight"].T + p["w_2.bias"]
    np.testing.assert_allclose(ffn(x).detach().numpy(), want, atol=1e-5)


def test_embedding_norm_computes_the_documented_formula() -> None:
    """docs/blocks.md's numpy for embedding_norm (LayerNorm after token x sqrt(D) + position),
    on the encoder's and the cached decoder's input; without the option no norm exists."""
    cfg = ModelConfig(src_vocab_size=12, tgt_vocab_size=14, d_model=8, n_heads=2, dropout=0.0)
    assert Seq2SeqTransformer(cfg).src_embed_norm is None
    torch.manual_seed(0)
    model = Seq2SeqTransformer(replace(cfg, embedding_norm=True)).eval()
    for norm in (model.src_embed_norm, model.tgt_embed_norm):
        torch.nn.init.normal_(norm.weight)
        torch.nn.init.normal_(norm.bias)
    ids = torch.tensor([[4, 5, 6], [7, 2, 0]])
    for embed, pos, norm, got in (
        (model.src_embed, model.src_pos, model.src_embed_norm, model.embed_source(ids)),
        (model.tgt_embed, model.tgt_pos, model.tgt_embed_norm, model.embed_target(ids, 2)),
    ):
        offset = 0 if embed is model.src_embed else 2
        table, rows = embed.weight.detach().numpy(), pos.table.detach().numpy()
        x = table[ids.numpy()] * np.sqrt(8) + rows[offset : offset + 3]
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        want = (x - mean) / np.sqrt(var + cfg.layer_norm_eps) * norm.weight.detach().numpy()
        want += norm.bias.detach().numpy()
        np.testing.assert_allclose(got.detach().numpy(), want, atol=1e-5)


@pytest.fixture(scope="module")
def bundles(small_reverse_task, small_recipe_factory, tmp_path_factory) -> dict[bool, Path]:
    """A recipe with every option trained 30 steps, exported fused (fp32, int8, inplace,
    steps) and unfused (fp32, int8)."""
    out = tmp_path_factory.mktemp("block-options")
    recipe = small_recipe_factory(**OPTIONS)
    train(small_reverse_task, recipe, out / "run", seed=0, max_steps=30, threads=1, progress=False)
    model, tokenizers, _ = load_checkpoint(out / "run" / "last")
    assert (model.cfg.norm_type, model.cfg.ffn, model.cfg.embedding_norm) == ("rms", "gated", True)
    assert isinstance(model.src_embed_norm, RMSNorm) and isinstance(model.tgt_embed_norm, RMSNorm)
    assert model.cfg.d_head == 16 and model.decoder_layers[0].self_attn.w_o.weight.shape == (32, 64)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    paths = {}
    for fuse, names in ((True, ("fp32", "int8", "inplace", "steps")), (False, ("fp32", "int8"))):
        paths[fuse] = out / f"fuse-{fuse}"
        export_bundle(model, tokenizers, paths[fuse], variants=VariantOptions(names), fuse=fuse)
    return paths


def _ops(path: Path) -> Counter:
    return Counter((node.domain or "ai.onnx", node.op_type) for node in onnx.load(path).graph.node)


@pytest.mark.parametrize("fuse", [True, False])
def test_export_passes_parity_levels_and_the_int8_gate(bundles, fuse: bool) -> None:
    manifest = json.loads((bundles[fuse] / C.MANIFEST_FILE).read_text())
    config = json.loads((bundles[fuse] / C.CONFIG_FILE).read_text())["model"]
    assert (config["norm_type"], config["ffn"], config["activation"], config["head_dim"]) == (
        "rms",
        "gated",
        "gelu-tanh",
        16,
    )
    assert config["embedding_norm"] is True
    parity = manifest["parity"]
    assert parity["passed"] and all(parity[f"level{i}"]["passed"] for i in (1, 2, 3))
    assert max(parity["level1"]["max_abs_diff"].values()) < 1e-5
    assert parity["level3"]["identical"] == parity["level3"]["inputs"]
    assert manifest["variants"]["int8"]["gate"]["passed"]
    if fuse:
        assert parity["inplace"]["passed"] and parity["steps"]["passed"]
    for file in (C.ENCODER_FILE, C.DECODER_FILE):
        ops = _ops(bundles[fuse] / file)
        assert not [op for _, op in ops if "LayerNorm" in op], ops  # RMS as plain operators
        assert {d for d, _ in ops} == ({"ai.onnx", MS_DOMAIN} if fuse else {"ai.onnx"})
        assert ops[(MS_DOMAIN, FUSED_OP)] == (0 if not fuse else 1 if file == C.ENCODER_FILE else 2)


def test_fused_and_unfused_bundles_generate_the_same(bundles) -> None:
    fused = Generator.load(bundles[True], providers="cpu", threads=1, search="loop")
    plain = Generator.load(bundles[False], providers="cpu", threads=1, search="loop")
    texts = [r.text for r in fused.generate(WORDS)]
    assert texts == [r.text for r in plain.generate(WORDS)] and any(texts)
