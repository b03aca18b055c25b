"""Importing a user's `torch.nn.Transformer` model (export/sources/torch_module.py), and the
model options it and the Marian importer rely on (ModelConfig's import fields)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file, save_model
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers
from torch import Tensor, nn
from torch.nn import functional as F

from edgeseq.build_model.model import Seq2SeqTransformer, sinusoidal_halves_table
from edgeseq.export.sources import SourceError, SourceModel
from edgeseq.export.sources.torch_module import MAPPING_FILE, detect, load
from edgeseq.runtime.config import IMPORT_FIELDS, ModelConfig
from edgeseq.runtime.errors import ConfigError

TINY = dict(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32, dropout=0.0)


# -- model options --------------------------------------------------------------------------
def test_import_fields_at_their_defaults_leave_config_json_unchanged() -> None:
    cfg = ModelConfig(src_vocab_size=11, tgt_vocab_size=13)
    assert not set(IMPORT_FIELDS) & set(cfg.to_dict())
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert ModelConfig.from_dict(json.loads(cfg.to_json())).final_norm is None


def test_import_fields_round_trip_when_set() -> None:
    cfg = ModelConfig(
        11, 13, scale_embedding=False, final_norm=True, output_bias=True, tie_output=True
    )
    data = cfg.to_dict()
    assert (data["scale_embedding"], data["final_norm"], data["output_bias"]) == (False, True, True)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    # Explicit values equal to today's rule are kept: they say what the source asked for.
    assert "final_norm" in ModelConfig(11, 13, final_norm=False).to_dict()


def test_import_fields_are_checked() -> None:
    with pytest.raises(ConfigError, match="final_norm must be true, false or null"):
        ModelConfig(11, 13, final_norm="yes").validate()
    with pytest.raises(ConfigError, match="apply to the encoder-decoder only"):
        ModelConfig(11, 11, architecture="decoder-only", output_bias=True).validate()


def test_model_follows_the_import_fields() -> None:
    torch.manual_seed(0)
    post = ModelConfig(11, 13, **TINY)
    plain = Seq2SeqTransformer(post)
    assert plain.encoder_norm is None and plain.output.bias is not None
    assert plain.src_embed.scale == pytest.approx(4.0)
    cfg = ModelConfig(
        11,
        13,
        **TINY,
        scale_embedding=False,
        final_norm=True,
        output_bias=True,
        tie_output=True,
        activation="silu",
        positional="sinusoidal-halves",
    )
    model = Seq2SeqTransformer(cfg)
    assert model.encoder_norm is not None and model.decoder_norm is not None
    assert model.output.weight is model.tgt_embed.weight
    assert torch.equal(model.output.bias, torch.zeros(13))
    assert isinstance(model.encoder_layers[0].ffn.act, torch.nn.SiLU)
    ids = torch.tensor([[5, 6]])
    assert torch.equal(model.src_embed(ids), model.src_embed.weight[ids])
    assert ModelConfig(11, 13, **TINY, norm="pre", final_norm=False).has_final_norm is False


def test_sinusoidal_halves_is_marians_table() -> None:
    """Marian's formula (transformers' MarianSinusoidalPositionalEmbedding), odd and even D."""
    for dim in (8, 7):
        pos = torch.arange(5, dtype=torch.float64)[:, None]
        j = torch.arange(dim, dtype=torch.float64)
        enc = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)
        want = torch.cat([torch.sin(enc[:, 0::2]), torch.cos(enc[:, 1::2])], dim=1).float()
        assert torch.allclose(sinusoidal_halves_table(5, dim), want, atol=1e-7)


# -- the torch adapter ------------------------------------------------------------------------
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torch_transformer"
USER_SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>"]  # the tutorial's ids 0..3
SPECIALS = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}
SRC_WORDS = [f"s{i}" for i in range(9)]
TGT_WORDS = [f"t{i}" for i in range(13)]
SIZES = dict(emb_size=16, nhead=2, num_encoder_layers=2, num_decoder_layers=1)
SIZES |= dict(dim_feedforward=24, maxlen=20)


def _example_module() -> Any:
    spec = importlib.util.spec_from_file_location("example_torch_model", EXAMPLE / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _example_module()


def tutorial(seed: int = 0, **options: Any) -> nn.Module:
    """The example's model, tiny, with non-zero biases and norms (so a missed copy shows)."""
    torch.manual_seed(seed)
    model = example.build(len(USER_SPECIALS) + 9, len(USER_SPECIALS) + 13, **SIZES, **options)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    return model


def write_source(
    directory: Path, module: nn.Module, build: Any = None, **mapping: Any
) -> dict[str, Any]:
    """Save module's weights and the tutorial vocabularies in `directory`; the mapping."""
    directory.mkdir(parents=True, exist_ok=True)
    save_model(module, str(directory / "model.safetensors"))
    (directory / "src.txt").write_text("\n".join(USER_SPECIALS + SRC_WORDS) + "\n")
    (directory / "tgt.txt").write_text("\n".join(USER_SPECIALS + TGT_WORDS) + "\n")
    base = dict(
        factory=build or (lambda: module),
        weights="model.safetensors",
        transformer="transformer",
        source_embedding="src_tok_emb",
        target_embedding="tgt_tok_emb",
        positional="positional_encoding",
        generator="generator",
        source_vocab="src.txt",
        target_vocab="tgt.txt",
        special_tokens=SPECIALS,
    )
    return base | mapping


def padded_batch(
    seed: int, vocab: int, lengths: list[int], start: int | None = None, end: int | None = None
) -> np.ndarray:
    """Rows of random ordinary ids (4..vocab-1), optionally <s>-first or </s>-last, padded."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in lengths:
        ids = rng.integers(4, vocab, size=n).tolist()
        rows.append(([start] if start is not None else []) + ids + ([end] if end else []))
    width = max(map(len, rows))
    return np.array([row + [0] * (width - len(row)) for row in rows], dtype=np.int64)


def assert_same_logits(source: SourceModel, seed: int = 0, atol: float = 1e-5) -> None:
    """Ours (full decode and the cached decode_step) == the user's modules, on a padded batch
    of random sources and targets, at every real target position."""
    cfg = source.model.cfg
    src = padded_batch(seed, cfg.src_vocab_size, [5, 2, 7], end=cfg.eos_id)
    tgt = padded_batch(seed + 1, cfg.tgt_vocab_size, [3, 6, 1], start=cfg.bos_id)
    want = source.reference.logits(torch.as_tensor(src), tgt).numpy()  # torch or numpy in
    model = source.model
    src_t, tgt_t = torch.as_tensor(src), torch.as_tensor(tgt)
    with torch.no_grad():
        full = model(src_t, tgt_t).numpy()
        src_keep = model.source_keep(src_t)
        cross_k, cross_v = model.cross_kv(model.encode(src_t, src_keep))
        past_k, past_v = model.empty_cache(len(src), cross_k[0])
        steps = []
        for t in range(tgt.shape[1]):
            logits, past_k, past_v = model.decode_step(
                tgt_t[:, t : t + 1], past_k, past_v, cross_k, cross_v, src_keep
            )
            steps.append(logits[:, 0].numpy())
    cached = np.stack(steps, axis=1)
    real = tgt != cfg.pad_id  # pad positions differ: the reference has no target padding mask
    assert np.abs(full[real] - want[real]).max() < atol
    assert np.abs(cached[real] - want[real]).max() < atol


COMBINATIONS = list(
    itertools.product((False, True), ("relu", "gelu"), (False, True), (False, True))
)


@pytest.mark.parametrize(("norm_first", "activation", "batch_first", "tie"), COMBINATIONS)
def test_tutorial_model_logits_equal_ours(
    tmp_path: Path, norm_first: bool, activation: str, batch_first: bool, tie: bool
) -> None:
    options = dict(norm_first=norm_first, activation=activation, batch_first=batch_first)
    module = tutorial(**options, tie=tie)
    source = load(tmp_path, mapping=write_source(tmp_path, module))
    cfg = source.model.cfg
    assert (cfg.norm, cfg.activation, cfg.tie_output) == (
        "pre" if norm_first else "post",
        activation,
        tie,
    )
    assert cfg.final_norm is (None if norm_first else True) and cfg.scale_embedding is True
    assert cfg.output_bias is (True if tie else None)  # the tutorial's generator has a bias
    assert source.adapter == "torch" and source.task is None
    assert source.reference.generate([[4, 2]], 1, 5) is None
    assert_same_logits(source)


def test_vocabulary_is_renumbered_specials_first(tmp_path: Path) -> None:
    module = tutorial()
    source = load(tmp_path, mapping=write_source(tmp_path, module))
    src_tok, tgt_tok = source.tokenizers.source, source.tokenizers.target
    assert [src_tok.id_to_token(i) for i in range(5)] == ["<pad>", "<s>", "</s>", "<unk>", "s0"]
    assert src_tok.encode("s0 s8 zz") == [4, 12, 3]
    assert tgt_tok.decode([4, 16, 2, 5]) == "t0 t12"
    # Row e of our embedding is the user's row of the same token.
    user_rows = [1, 2, 3, 0, *range(4, 17)]  # <pad> <bos> <eos> <unk> t0..t12 in user ids
    table = module.tgt_tok_emb.embedding.weight
    assert torch.equal(source.model.tgt_embed.weight, table[user_rows])
    assert torch.equal(source.model.output.bias, module.generator.bias[user_rows])


def test_mapping_file_with_a_file_or_module_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example as a user runs it: make_example.py, then the mapping file."""
    out = tmp_path / "example"
    subprocess.run(
        [sys.executable, str(EXAMPLE / "make_example.py"), str(out)],
        check=True,
        capture_output=True,
    )
    assert detect(out) and detect(out / MAPPING_FILE) and not detect(tmp_path)
    source = load(out / MAPPING_FILE)
    assert source.model.cfg.positional == "learned"  # the tutorial's float32 table, copied
    assert source.model.cfg.max_len == 128
    assert_same_logits(source)
    monkeypatch.chdir(out)  # "module:function" imports from the current directory
    monkeypatch.delitem(sys.modules, "model", raising=False)
    again = load(out / MAPPING_FILE, factory="model:build", max_len=16)
    assert again.model.cfg.max_len == 16
    with pytest.raises(SourceError, match="torch mapping has unknown keys positonal"):
        load(out, positonal="none")
    with pytest.raises(SourceError, match="cannot import factory nowhere"):
        load(out, factory="nowhere:build")


class PlainModel(nn.Module):
    """No scaling, learned positions as an nn.Embedding, SiLU, bias=False, a tied output
    without bias: the options beyond the tutorial."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.src = nn.Embedding(13, 16)
        self.tgt = nn.Embedding(17, 16)
        self.pos = nn.Embedding(12, 16)
        self.transformer = nn.Transformer(
            16, 2, 1, 2, 24, 0.0, activation=F.silu, batch_first=batch_first, bias=False
        )
        self.out = nn.Linear(16, 17, bias=False)
        self.out.weight = self.tgt.weight


def test_plain_embeddings_learned_positions_silu_and_no_biases(tmp_path: Path) -> None:
    module = PlainModel()
    mapping = write_source(tmp_path, module, source_embedding="src", target_embedding="tgt")
    mapping |= dict(positional="pos", generator="out", scale_embedding=False)
    source = load(tmp_path, mapping=mapping)
    cfg = source.model.cfg
    assert (cfg.activation, cfg.positional, cfg.max_len, cfg.scale_embedding) == (
        "silu",
        "learned",
        12,
        False,
    )
    assert cfg.tie_output and source.model.output.bias is None
    assert torch.equal(source.model.encoder_layers[0].self_attn.w_q.bias, torch.zeros(16))
    assert_same_logits(source)
    # The same model scaled by its forward (outside the embedding module) and without positions.
    source = load(tmp_path, mapping=mapping | dict(scale_embedding=True, positional="none"))
    assert source.model.cfg.scale_embedding and not source.model.src_pos.table.any()
    assert_same_logits(source)


def test_torch_file_weights_and_a_tokenizers_json_vocabulary(tmp_path: Path) -> None:
    module = tutorial(batch_first=True)
    mapping = write_source(tmp_path, module)
    torch.save({"model": module.state_dict(), "step": torch.tensor(3)}, tmp_path / "ckpt.pt")
    vocab = {token: i for i, token in enumerate(USER_SPECIALS + TGT_WORDS)}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.save(str(tmp_path / "tgt.json"))
    mapping |= dict(weights="ckpt.pt", weights_key="model", target_vocab="tgt.json")
    source = load(tmp_path, mapping=mapping)
    assert source.tokenizers.target.encode("t1 t12 x") == [5, 16, 3]
    assert not source.tokenizers.shared
    assert_same_logits(source)


# -- refusals -----------------------------------------------------------------------------------
class CustomAttention(nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("never called")


class Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(8))

    def forward(self, x: Tensor) -> Tensor:
        return x


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(20, 1, 16))

    def forward(self, x: Tensor) -> Tensor:
        return 2 * x + self.table[: x.shape[0]]


def _custom_attention(module: nn.Module) -> None:
    module.transformer.decoder.layers[0].multihead_attn = CustomAttention()


def _tanh_gelu(module: nn.Module) -> None:
    module.transformer.encoder.layers[1].activation = nn.GELU(approximate="tanh")


def _rotary(module: nn.Module) -> None:
    module.positional_encoding = Rotary()


def _scaled(module: nn.Module) -> None:
    module.positional_encoding = Scaled()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (_custom_attention, "decoder.layers.0.multihead_attn is CustomAttention, not torch.nn.Mul"),
        (_tanh_gelu, r"encoder.layers.1.activation GELU\(approximate='tanh'\) is not relu"),
        (_rotary, r"positional positional_encoding must hold one \(L, 16\) table.*inv_freq"),
        (_scaled, "positional positional_encoding does not add a fixed table"),
    ],
)
def test_refuses_modules_that_do_not_map(tmp_path: Path, change: Any, match: str) -> None:
    module = tutorial()
    change(module)
    with pytest.raises(SourceError, match=match):
        load(tmp_path, mapping=write_source(tmp_path, module))


def test_refuses_weights_vocabularies_and_mappings_that_do_not_fit(tmp_path: Path) -> None:
    module = tutorial()
    mapping = write_source(tmp_path, module)
    state = module.state_dict()
    save_file({**state, "extra.weight": torch.ones(1)}, tmp_path / "more.safetensors")
    torch.save({"layer": nn.Linear(2, 2)}, tmp_path / "pickled.pt")  # a pickled object
    (tmp_path / "short.txt").write_text("\n".join(USER_SPECIALS + SRC_WORDS[:-1]) + "\n")
    (tmp_path / "nobos.txt").write_text("\n".join(["<unk>", "<pad>", "<eos>", *SRC_WORDS]))
    cases = [
        (dict(weights="more.safetensors"), "unexpected key extra.weight"),
        (dict(weights="pickled.pt"), r"torch.load\(weights_only=True\)"),
        (dict(source_vocab="short.txt"), "source_vocab has 12 tokens but the source embedding"),
        (dict(source_vocab="nobos.txt"), "special token bos '<bos>' is not in"),
        (dict(transformer="generator"), "generator is Linear, not torch.nn.Transformer"),
        (dict(positional="missing"), "positional 'missing' is not an attribute"),
        (dict(scale_embedding=False), "scales by sqrt.d_model. but scale_embedding is false"),
    ]
    for change, match in cases:
        with pytest.raises(SourceError, match=match):
            load(tmp_path, mapping=mapping | change)
    save_file(
        {k: v for k, v in state.items() if k != "generator.bias"}, tmp_path / "less.safetensors"
    )
    with pytest.raises(SourceError, match=r"missing key generator\.bias"):
        load(tmp_path, mapping=mapping | dict(weights="less.safetensors"))
