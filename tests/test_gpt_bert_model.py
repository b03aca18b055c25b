"""GPT (decoder-only) and BERT (encoder-only): shapes, masks, cache, shared blocks, config."""

from __future__ import annotations

import pytest
import torch

from edgeseq.build_model.decoder_only import DecoderOnlyTransformer
from edgeseq.build_model.encoder_only import EncoderOnlyTransformer
from edgeseq.build_model.kinds import build_transformer
from edgeseq.build_model.model import EncoderLayer, MultiHeadAttention, Seq2SeqTransformer
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 21
VARIANTS = {"post": {}, "pre-learned-gelu-tied": dict(norm="pre", positional="learned")}
VARIANTS["pre-learned-gelu-tied"].update(activation="gelu", tie_output=True)


def gpt(seed: int = 0, **overrides) -> DecoderOnlyTransformer:
    """A random eval-mode GPT: d_model 32, 4 heads, 2 layers, max_len 24."""
    options = dict(d_model=32, n_heads=4, n_decoder_layers=2, d_ff=48, max_len=24, dropout=0.0)
    cfg = ModelConfig(VOCAB, VOCAB, architecture="decoder-only", **(options | overrides))
    torch.manual_seed(seed)
    return DecoderOnlyTransformer(cfg).eval()


def bert(seed: int = 0, **overrides) -> EncoderOnlyTransformer:
    """A random eval-mode BERT classifier over 7 labels: d_model 32, 2 layers."""
    options = dict(d_model=32, n_heads=4, n_encoder_layers=2, d_ff=48, max_len=24, dropout=0.0)
    cfg = ModelConfig(VOCAB, 7, architecture="encoder-only", **(options | overrides))
    torch.manual_seed(seed)
    return EncoderOnlyTransformer(cfg).eval()


def ids(rows: int, length: int, seed: int) -> torch.Tensor:
    """(rows, length) int64 ids without specials."""
    return torch.randint(4, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def positions(batch: int, length: int, start: int = 0) -> torch.Tensor:
    """(batch, length) int64 positions start..start+length-1."""
    return (torch.arange(length) + start)[None].expand(batch, length)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gpt_shapes_and_cached_equals_uncached(variant: str) -> None:
    model = gpt(**VARIANTS[variant])
    x = ids(3, 9, seed=1)
    full = model(None, x)
    assert full.shape == (3, 9, VOCAB)
    k, v = model.empty_cache(3, full)
    mask = torch.ones(3, 0, dtype=torch.int64)
    with torch.no_grad():
        pieces = []
        for start, stop in ((0, 4), (4, 5), (5, 9)):  # a prompt, then 1, then 4 more
            mask = torch.cat([mask, torch.ones(3, stop - start, dtype=torch.int64)], dim=1)
            pos = positions(3, stop - start, start)
            logits, k, v = model.step(x[:, start:stop], pos, mask, k, v)
            pieces.append(logits)
    assert k[0].shape == (3, 4, 9, 8) and len(k) == 2
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_gpt_is_causal() -> None:
    model = gpt()
    x = ids(2, 8, seed=2)
    y = x.clone()
    y[:, 5:] = 4 + (y[:, 5:] + 1) % (VOCAB - 4)  # change the future only
    with torch.no_grad():
        a, b = model(None, x), model(None, y)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_gpt_left_padding_with_position_ids_equals_unpadded() -> None:
    model = gpt()
    x = ids(1, 6, seed=3)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.int64), x], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    pos = torch.tensor([[0, 0, 0, 0, 1, 2, 3, 4, 5]])
    empty_k, empty_v = model.empty_cache(1, mask)
    with torch.no_grad():
        left, _, _ = model.step(padded, pos, mask, empty_k, empty_v)
        plain = model(None, x)
    assert torch.isfinite(left).all()  # pad rows see themselves: no NaN anywhere
    torch.testing.assert_close(left[:, 3:], plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bert_shapes_padding_and_bidirectional(variant: str) -> None:
    options = {k: v for k, v in VARIANTS[variant].items() if k != "tie_output"}
    model = bert(**options)
    x = ids(2, 7, seed=4)
    padded = torch.cat([x, torch.zeros(2, 3, dtype=torch.int64)], dim=1)
    with torch.no_grad():
        hidden, logits = model.encode(x, torch.ones_like(x))
        hidden_p, logits_p = model.encode(padded, (padded != 0).long())
        y = x.clone()
        y[:, -1] = 4 + (y[:, -1] + 1) % (VOCAB - 4)
        hidden_y, _ = model.encode(y, torch.ones_like(y))
    assert hidden.shape == (2, 7, 32) and logits.shape == (2, 7)
    assert model(padded).shape == (2, 1, 7)
    torch.testing.assert_close(logits_p, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden_p[:, :7], hidden, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(hidden_y[:, 0], hidden[:, 0])  # the first token sees the last


def test_all_three_share_the_block_classes() -> None:
    seq = Seq2SeqTransformer(ModelConfig(VOCAB, VOCAB, d_model=32, n_heads=4, dropout=0.0))
    for model in (gpt(), bert(), seq):
        blocks = model.layers if hasattr(model, "layers") else model.encoder_layers
        assert all(type(block) is EncoderLayer for block in blocks)
        assert all(type(block.self_attn) is MultiHeadAttention for block in blocks)
    assert type(build_transformer(gpt().cfg)) is DecoderOnlyTransformer
    assert type(build_transformer(bert().cfg)) is EncoderOnlyTransformer
    assert type(build_transformer(seq.cfg)) is Seq2SeqTransformer


def test_config_architecture_field_is_validated_and_defaults() -> None:
    old = ModelConfig(VOCAB, VOCAB).to_dict()
    del old["architecture"]  # a config.json written before the field existed
    assert ModelConfig.from_dict(old).architecture == "encoder-decoder"
    with pytest.raises(ConfigError, match="architecture must be one of"):
        ModelConfig(VOCAB, VOCAB, architecture="gpt").validate()
    with pytest.raises(ConfigError, match="one vocabulary"):
        ModelConfig(VOCAB, VOCAB + 1, architecture="decoder-only").validate()
    with pytest.raises(ConfigError, match="tie_output"):
        ModelConfig(VOCAB, 7, architecture="encoder-only", tie_output=True).validate()


def test_stress_label_counts_vowels_and_caps() -> None:
    from edgeseq.build_model.word_tasks import stress_label

    assert stress_label("F OW1 T AH0 G R AE2 F") == "1"
    assert stress_label("F AH0 T AA1 G R AH0 F IY0") == "2"
    assert stress_label("AH0 B AH0 K AH0 D AH0 B R AA1") == "5"
    assert stress_label("DH AH0") is None


def test_recipe_architecture_must_fit_the_task(tmp_path) -> None:
    from edgeseq.build_model.recipe import Recipe
    from edgeseq.build_model.run import check_architecture
    from edgeseq.build_model.tasks import Task

    words = Task("words", {}, [("ph", "photo")], [], [], "char", "char", shared_vocab=True)
    with pytest.raises(ConfigError, match='"architecture": "decoder-only"'):
        check_architecture(words, Recipe.from_dict({"d_model": 32}))
    check_architecture(words, Recipe.from_dict({"architecture": "decoder-only"}))
