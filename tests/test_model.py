"""Seq2SeqTransformer: positional table, masks, padding, cached decoding, length limits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from edgeseq.build_model.model import Seq2SeqTransformer, sinusoidal_table
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import InputTooLongError

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is faster

VOCAB = 23
VARIANTS = {
    "post-sinusoidal-relu": {},
    "pre-norm": {"norm": "pre"},
    "learned-positions": {"positional": "learned"},
    "gelu": {"activation": "gelu"},
    "tied-output": {"tie_output": True},
}


def make_model(seed: int = 0, **overrides) -> Seq2SeqTransformer:
    """A random eval-mode model, d_model 32, 2+2 layers, max_len 24."""
    options = (
        dict(
            d_model=32,
            n_heads=4,
            n_encoder_layers=2,
            n_decoder_layers=2,
            d_ff=48,
            max_len=24,
            dropout=0.0,
        )
        | overrides
    )
    cfg = ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB + 4, **options)
    torch.manual_seed(seed)
    return Seq2SeqTransformer(cfg).eval()


def random_ids(rows: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """(rows, length) int64 ids in 4..vocab-1 (no specials)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (rows, length), generator=gen)


def test_sinusoidal_table_equals_the_formula() -> None:
    max_len, d_model = 50, 16
    table = sinusoidal_table(max_len, d_model).numpy()
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("k", [1, 3, 17])
def test_shift_by_k_is_one_fixed_rotation_per_frequency(k: int) -> None:
    """[sin, cos](pos + k) = R(k w_i) [sin, cos](pos) with the same 2x2 matrix for every pos."""
    max_len, d_model = 200, 32
    table = sinusoidal_table(max_len, d_model).double().numpy()
    for i in range(d_model // 2):
        w = 1 / 10000 ** (2 * i / d_model)
        rotation = np.array(
            [[math.cos(k * w), math.sin(k * w)], [-math.sin(k * w), math.cos(k * w)]]
        )
        pairs = table[:, 2 * i : 2 * i + 2]  # (L, 2): (sin, cos)
        np.testing.assert_allclose(pairs[:-k] @ rotation.T, pairs[k:], atol=1e-5)


def test_causal_mask_hides_the_future() -> None:
    model = make_model()
    src = random_ids(2, 7, VOCAB, seed=1)
    tgt = random_ids(2, 9, VOCAB + 4, seed=2)
    base = model(src, tgt)
    for t in range(1, 9):
        changed = tgt.clone()
        changed[:, t] = (changed[:, t] - 4 + 1) % (VOCAB) + 4  # another real token
        out = model(src, changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=0)
        assert not torch.allclose(out[:, t], base[:, t])  # position t itself does see it


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_padding_never_changes_real_outputs(variant: str) -> None:
    model = make_model(**VARIANTS[variant])
    src = random_ids(1, 6, VOCAB, seed=3)
    tgt = random_ids(1, 5, VOCAB + 4, seed=4)
    base = model(src, tgt)  # (1, 5, V)
    pad = model.cfg.pad_id
    src_padded = torch.cat([src, torch.full((1, 4), pad)], dim=1)
    tgt_padded = torch.cat([tgt, torch.full((1, 3), pad)], dim=1)
    torch.testing.assert_close(model(src_padded, tgt)[:, :5], base, rtol=0, atol=1e-5)
    torch.testing.assert_close(model(src, tgt_padded)[:, :5], base, rtol=0, atol=1e-5)
    # and in a batch with a longer row
    other_src, other_tgt = random_ids(1, 10, VOCAB, 5), random_ids(1, 8, VOCAB + 4, 6)
    batch = model(torch.cat([src_padded, other_src]), torch.cat([tgt_padded, other_tgt]))
    torch.testing.assert_close(batch[:1, :5], base, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("chunks", [[1] * 9, [3, 2, 4], [9]])
def test_cached_decode_step_matches_full_decode(variant: str, chunks: list[int]) -> None:
    model = make_model(**VARIANTS[variant])
    src = random_ids(3, 7, VOCAB, seed=7)
    src[0, 5:] = model.cfg.pad_id  # a padded source row
    tgt = random_ids(3, 9, VOCAB + 4, seed=8)
    with torch.no_grad():
        src_keep = model.source_keep(src)
        memory = model.encode(src, src_keep)
        full = model.decode(tgt, memory, src_keep)  # (B, T, V)
        cross_k, cross_v = model.cross_kv(memory)
        past_k, past_v = model.empty_cache(3, memory)
        pieces, start = [], 0
        for size in chunks:
            logits, past_k, past_v = model.decode_step(
                tgt[:, start : start + size], past_k, past_v, cross_k, cross_v, src_keep
            )
            pieces.append(logits)
            start += size
    assert len(past_k) == len(past_v) == 2  # one tensor per decoder layer
    assert all(k.shape == (3, 4, 9, 8) for k in past_k + past_v)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


def test_inputs_longer_than_max_len_raise() -> None:
    model = make_model()  # max_len 24
    with pytest.raises(InputTooLongError, match="needs 25 positions but the model's max_len is 24"):
        model.encode(random_ids(1, 25, VOCAB, seed=9))
    memory = model.encode(random_ids(1, 5, VOCAB, seed=9))
    with pytest.raises(InputTooLongError, match="max_len"):
        model.decode(random_ids(1, 25, VOCAB + 4, seed=10), memory, torch.ones(1, 5, dtype=bool))
    cross_k, cross_v = model.cross_kv(memory)
    past = (torch.zeros(1, 4, 23, 8),) * 2
    with pytest.raises(InputTooLongError, match="needs 25 positions"):
        model.decode_step(
            random_ids(1, 2, VOCAB + 4, 11),
            past,
            past,
            cross_k,
            cross_v,
            torch.ones(1, 5, dtype=bool),
        )
