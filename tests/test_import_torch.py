"""Importing a user's `torch.nn.Transformer` model (export/sources/torch_module.py), and the
model options it and the Marian importer rely on (ModelConfig's import fields)."""

from __future__ import annotations

import json

import pytest
import torch

from edgeseq.build_model.model import Seq2SeqTransformer, sinusoidal_halves_table
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
