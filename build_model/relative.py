"""T5's relative position bias (`ModelConfig.positional == "relative"`).

    bias = RelativePositionBias(cfg, bidirectional=True)   # one per stack
    scores_bias = bias(q_pos, k_pos)                       # (1, H, N, S), added to Q Kᵀ / sqrt(dh)

No positional table is added to the embeddings. Instead each stack (encoder: bidirectional,
decoder: causal) learns one (buckets, H) table; the signed distance key - query of every
query/key pair falls into a bucket (`relative_bucket`: exact for small distances, logarithmic
up to max_distance, one bucket beyond), and that bucket's row, one value per head, is added
to the self-attention scores of every layer of the stack. Cross-attention gets no bias.

Every distance at or past max_distance falls into the last bucket of its side, so the buckets
of the distances -max_distance .. max_distance are computed once (float32, T5's arithmetic)
and kept as an int64 lookup (`RelativePositionBias.buckets`), and a distance is clamped into
that range before the lookup: the exported graphs gather from a constant instead of
evaluating a logarithm, the same ids as transformers' `T5Attention._relative_position_bucket`
bit for bit, at any length (no max_len: T5 runs past its n_positions). docs/blocks.md
writes the formula out for a runtime without torch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from edgeseq.runtime.config import ModelConfig


def relative_bucket(
    relative: Tensor, bidirectional: bool, buckets: int, max_distance: int
) -> Tensor:
    """T5's bucket of each signed distance key - query: int64 (...) -> int64 (...) in
    0..buckets-1. Bidirectional: half the buckets for keys after the query; causal: keys
    after the query (never attended) share bucket 0 with distance 0."""
    relative = relative.to(torch.int64)
    offset = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        offset = (relative > 0).to(torch.int64) * buckets
        distance = relative.abs()
    else:
        distance = -torch.minimum(relative, torch.zeros_like(relative))
    max_exact = buckets // 2
    # clamped below at max_exact: the logarithm is only used (and finite) from there on
    large = max_exact + (
        torch.log(distance.clamp(min=max_exact).float() / max_exact)
        / math.log(max_distance / max_exact)
        * (buckets - max_exact)
    ).to(torch.int64)
    large = torch.minimum(large, torch.full_like(large, buckets - 1))
    return offset + torch.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
    """One stack's relative position bias: a learned (buckets, H) table read through the
    buckets of the distances up to max_distance (farther ones clamped to it: the same bucket)."""

    def __init__(self, cfg: ModelConfig, bidirectional: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cfg.relative_buckets, cfg.n_heads) * 0.02)
        self.reach = cfg.relative_max_distance  # |distance| at and past it: one bucket
        distances = torch.arange(-self.reach, self.reach + 1)  # (2 reach + 1,)
        buckets = relative_bucket(
            distances, bidirectional, cfg.relative_buckets, cfg.relative_max_distance
        )
        self.register_buffer("buckets", buckets, persistent=False)  # recomputed, not stored

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """q_pos (N,) and k_pos (S,) int64 positions -> bias (1, H, N, S)."""
        distance = (k_pos[None, :] - q_pos[:, None]).clamp(-self.reach, self.reach)  # (N, S)
        return self.weight[self.buckets[distance + self.reach]].permute(2, 0, 1)[None]
