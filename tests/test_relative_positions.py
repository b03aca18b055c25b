"""The block option `positional: "relative"` (T5's relative position bias): config.json
unchanged without it, the refusals, the buckets of docs/blocks.md (= transformers' T5), the
cached decoder step against the full decode, and a model trained a few steps by a recipe with
it, exported with fused attention (the bias as onnxruntime's attention_bias) and every graph
variant (int8, search, steps, inplace), each passing its parity group; unfused, the steps
decoder carries the bias of its cache slots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from edgeseq.build_model.checkpoint import load_checkpoint
from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.build_model.relative import relative_bucket
from edgeseq.build_model.train import Recipe, train
from edgeseq.export.fused_ops import FUSED_OP
from edgeseq.export.kinds.seq2seq.bundle import export_bundle
from edgeseq.export.variants import VariantOptions
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import ConfigError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")
OPTIONS = dict(positional="relative", relative_buckets=8, relative_max_distance=12)
OPTIONS |= dict(norm="pre", norm_type="rms", dropout=0.0)
WORDS = ["abc", "fedcba", "a", "cabbac", "bb"]


def test_defaults_leave_config_json_as_it_was_and_options_round_trip() -> None:
    plain = ModelConfig(src_vocab_size=10, tgt_vocab_size=12)
    assert not {"relative_buckets", "relative_max_distance"} & set(plain.to_dict())
    rel = ModelConfig(src_vocab_size=10, tgt_vocab_size=12, **OPTIONS).validate()
    assert rel.to_dict()["relative_buckets"] == 8 and rel.to_dict()["positional"] == "relative"
    assert ModelConfig.from_json(rel.to_json()) == rel
    t5 = ModelConfig(src_vocab_size=10, tgt_vocab_size=12, positional="relative")
    assert "relative_buckets" not in t5.to_dict()  # T5's 32 / 128 are the defaults


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"relative_buckets": 7}, "relative_buckets must be an even integer >= 4, got 7"),
        ({"relative_max_distance": 4}, "relative_max_distance must be an integer >= "),
        ({"positional": "learned", "relative_buckets": 8}, "apply to positional relative only"),
        ({"architecture": "decoder-only"}, "positional relative applies to the encoder-decoder"),
    ],
)
def test_bad_relative_options_are_refused_naming_the_field(options: dict, match: str) -> None:
    options = {"positional": "relative", **options}
    with pytest.raises(ConfigError, match=match):
        ModelConfig(src_vocab_size=12, tgt_vocab_size=12, **options).validate()
    with pytest.raises(ConfigError, match=match):
        Recipe.from_dict({"d_model": 32, "n_heads": 4, **options})


def documented_bucket(relative: int, bidirectional: bool, buckets: int, distance: int) -> int:
    """docs/blocks.md's bucket function, in plain Python (float32 where it says so)."""
    offset = 0
    if bidirectional:
        buckets //= 2
        offset = buckets if relative > 0 else 0
        n = abs(relative)
    else:
        n = max(-relative, 0)
    exact = buckets // 2
    if n < exact:
        return offset + n
    ratio = np.float32(np.log(np.float32(n) / np.float32(exact)))
    scaled = np.float32(ratio / np.float32(math.log(distance / exact)))
    return offset + min(exact + int(np.float32(scaled * np.float32(buckets - exact))), buckets - 1)


@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (8, 12), (4, 4)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_buckets_are_t5s_and_the_documented_formula(
    buckets: int, distance: int, bidirectional: bool
) -> None:
    relative = torch.arange(-600, 601)
    ours = relative_bucket(relative, bidirectional, buckets, distance)
    documented = [documented_bucket(int(r), bidirectional, buckets, distance) for r in relative]
    assert ours.tolist() == documented
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    theirs = t5.T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
    assert torch.equal(ours, theirs)


def test_cached_steps_equal_the_full_decode() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=20, tgt_vocab_size=24, d_model=16, max_len=12, **OPTIONS)
    model = Seq2SeqTransformer(cfg).eval()
    with torch.no_grad():
        for stack in (model.encoder_relative, model.decoder_relative):
            stack.weight.normal_()  # a bias that matters
        src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
        tgt = torch.tensor([[1, 4, 5, 6, 7, 8, 9], [1, 11, 12, 13, 0, 0, 0]])
        full = model(src, tgt)
        keep = model.source_keep(src)
        cross_k, cross_v = model.cross_kv(model.encode(src, keep))
        past_k, past_v = model.empty_cache(2, full)
        steps = []
        for t in range(tgt.shape[1]):
            logits, past_k, past_v = model.decode_step(
                tgt[:, t : t + 1], past_k, past_v, cross_k, cross_v, keep
            )
            steps.append(logits[:, 0])
    assert torch.allclose(torch.stack(steps, dim=1)[0], full[0], atol=1e-5)
    assert torch.allclose(torch.stack(steps, dim=1)[1, :4], full[1, :4], atol=1e-5)
    plain_fields = {**cfg.to_dict(), "positional": "sinusoidal"}
    del plain_fields["relative_buckets"], plain_fields["relative_max_distance"]
    plain = Seq2SeqTransformer(ModelConfig(**plain_fields))
    names = set(dict(model.named_parameters())) - set(dict(plain.named_parameters()))
    assert names == {"encoder_relative.weight", "decoder_relative.weight"}


@pytest.fixture(scope="module")
def relative_run(small_reverse_task, small_recipe_factory, tmp_path_factory) -> Path:
    """A recipe with relative positions trained 6 epochs (fewer leave near-ties that the
    BeamSearch operator and the loop break apart at the length cap, with any positions): the
    run directory."""
    out = tmp_path_factory.mktemp("relative")
    recipe = small_recipe_factory(**OPTIONS, epochs=6)
    train(small_reverse_task, recipe, out / "run", seed=0, max_steps=100, threads=1, progress=False)
    return out / "run"


def test_trained_model_exports_fused_with_every_graph_variant(relative_run: Path, tmp_path) -> None:
    model, tokenizers, _ = load_checkpoint(relative_run / "last")
    assert model.cfg.positional == "relative" and model.encoder_relative is not None
    bundle = tmp_path / "bundle"
    names = ("fp32", "int8", "search", "steps", "inplace")
    export_bundle(model, tokenizers, bundle, variants=VariantOptions(names))
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text())
    config = json.loads((bundle / C.CONFIG_FILE).read_text())["model"]
    assert (config["positional"], config["relative_buckets"]) == ("relative", 8)
    parity = manifest["parity"]
    assert parity["passed"] and all(parity[f"level{i}"]["passed"] for i in (1, 2, 3))
    assert max(parity["level1"]["max_abs_diff"].values()) < 1e-5
    assert parity["level3"]["identical"] == parity["level3"]["inputs"]
    assert all(parity[key]["passed"] for key in ("search", "steps", "inplace"))
    assert manifest["variants"]["int8"]["gate"]["passed"]
    for file in (C.ENCODER_FILE, C.DECODER_FILE, C.STEPS_FILES["fp32"]):  # bias fed to MHA
        nodes = [n for n in onnx.load(bundle / file).graph.node if n.op_type == FUSED_OP]
        assert any(len(n.input) > 5 and n.input[5] for n in nodes), file
    loop = Generator.load(bundle, providers="cpu", threads=1, search="loop")
    graph = Generator.load(bundle, providers="cpu", threads=1, search="graph")
    texts = [r.text for r in loop.generate(WORDS)]
    assert texts == [r.text for r in graph.generate(WORDS)] and any(texts)
    beam = GenerationOptions(beam_size=4)  # the loop's beam search: the in-place decoder
    assert [r.text for r in loop.generate(WORDS, beam)] == [
        r.text for r in graph.generate(WORDS, beam)
    ]


def test_unfused_steps_decoder_carries_the_bias_of_its_slots(relative_run: Path, tmp_path) -> None:
    """--no-fuse: the steps graph in standard operators, rows at different positions."""
    model, tokenizers, _ = load_checkpoint(relative_run / "last")
    bundle = tmp_path / "b"
    variants = VariantOptions(("fp32", "steps"))
    export_bundle(model, tokenizers, bundle, variants=variants, fuse=False)
    parity = json.loads((bundle / C.MANIFEST_FILE).read_text())["parity"]
    assert parity["steps"]["passed"] and parity["steps"]["fp32"]["max_abs_diff"] < 1e-5
    graph = onnx.load(bundle / C.STEPS_FILES["fp32"]).graph
    assert {n.domain or "ai.onnx" for n in graph.node} == {"ai.onnx"}


def test_relative_models_have_no_table_cap_in_python_or_the_browser() -> None:
    """ModelConfig.max_positions: max_len for a table, RELATIVE_MAX_POSITIONS for "relative";
    runtime/web/edgeseq.mjs mirrors the constant (its `maxPositions`)."""
    from edgeseq.runtime.config import RELATIVE_MAX_POSITIONS

    cfg = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, max_len=8)
    assert cfg.max_positions == 8
    relative = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, max_len=8, **OPTIONS)
    assert relative.max_positions == RELATIVE_MAX_POSITIONS > relative.max_len
    web = (Path(__file__).parents[1] / "runtime" / "web" / "edgeseq.mjs").read_text()
    assert f"export const RELATIVE_MAX_POSITIONS = {RELATIVE_MAX_POSITIONS};" in web
