"""The position-wise pieces of a Transformer block, chosen by `ModelConfig`:

    norm = make_norm(cfg)    # cfg.norm_type: "layer" (nn.LayerNorm) | "rms" (RMSNorm, T5's)
    ffn = make_ffn(cfg)      # cfg.ffn: "plain" (FeedForward) | "gated" (GatedFeedForward)

Both map (..., D) to (..., D). The arithmetic a runtime without torch must reproduce is
written out in docs/blocks.md.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from edgeseq.runtime.config import ModelConfig

# ModelConfig.activation -> module; "gelu-tanh" is the tanh approximation (T5 v1.1's gelu_new)
ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu-tanh": lambda: nn.GELU(approximate="tanh"),
    "silu": nn.SiLU,
}


class RMSNorm(nn.Module):
    """T5's layer norm: x / sqrt(mean(x²) + eps) * weight, over the last axis; no mean
    subtraction and no bias (T5LayerNorm, LLaMA's RMSNorm)."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))  # (D,)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., D)."""
        mean_square = x.pow(2).mean(-1, keepdim=True)  # (..., 1)
        return x * torch.rsqrt(mean_square + self.eps) * self.weight


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The norm every sublayer and final norm of `cfg` uses: nn.LayerNorm or RMSNorm."""
    if cfg.norm_type == "rms":
        return RMSNorm(cfg.d_model, cfg.layer_norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)


class FeedForward(nn.Module):
    """W₂ act(W₁ x + b₁) + b₂, act = ReLU (the paper), GELU (exact, erf, or its tanh
    approximation) or SiLU (swish)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.w_2(self.dropout(self.act(self.w_1(x))))


class GatedFeedForward(FeedForward):
    """W₂ (act(W₁ x + b₁) ⊙ (W₃ x + b₃)) + b₂: a gated linear unit (GEGLU with GELU as in
    T5 v1.1 / Flan-T5, SwiGLU with SiLU). W₁ is the gate (T5's wi_0), W₃ the linear branch
    (wi_1), W₂ the output (wo); an import without biases sets them to zero (exact)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str) -> None:
        super().__init__(d_model, d_ff, dropout, activation)
        self.w_3 = nn.Linear(d_model, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, D)."""
        hidden = self.act(self.w_1(x)) * self.w_3(x)  # (B, T, d_ff)
        return self.w_2(self.dropout(hidden))


def make_ffn(cfg: ModelConfig) -> FeedForward:
    """The feed-forward network of every block of `cfg`: FeedForward or GatedFeedForward."""
    kind = GatedFeedForward if cfg.ffn == "gated" else FeedForward
    return kind(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation)
