"""The encoder-only kind (BERT) in PyTorch: the encoder stack (bidirectional) of the
encoder–decoder's blocks (build_model/model.py) and a classification head.

    bert = EncoderOnlyTransformer(cfg)     # cfg.architecture == "encoder-only"
    hidden, logits = bert.encode(input_ids, attention_mask)   # (B, S, D), (B, C)

A BERT block is an `EncoderLayer` with the bidirectional padding mask. `forward(src_ids,
tgt_in)` classifies `src_ids` into one label, returned as (B, 1, C) logits for the first
target position, so one training loop trains every kind.
"""

from __future__ import annotations

from torch import Tensor, nn

from edgeseq.runtime.config import ModelConfig

from .model import EncoderLayer, PositionalEncoding, TokenEmbedding, final_norm, init_linears


class EncoderOnlyTransformer(nn.Module):
    """BERT: the encoder stack (bidirectional) and a classification head over the
    mask-weighted mean of the last hidden states: `tgt_vocab_size` labels."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.src_vocab_size, cfg.d_model)
        self.pos = PositionalEncoding(cfg.max_len, cfg.d_model, cfg.positional)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.norm = final_norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.tgt_vocab_size)
        init_linears(self, self.head)

    def encode(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """input_ids (B, S) int64 (tokens + </s>, right-padded), attention_mask (B, S) int64 or
        bool, nonzero at real tokens -> last_hidden_state (B, S, D) and label logits (B, C)."""
        keep = attention_mask != 0  # (B, S)
        x = self.dropout(self.pos(self.embed(input_ids)))
        for layer in self.layers:
            x = layer(x, keep[:, None, None, :])
        if self.norm is not None:
            x = self.norm(x)
        weight = keep.to(x.dtype)[:, :, None]  # (B, S, 1)
        pooled = (x * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1.0)  # (B, D)
        return x, self.head(self.dropout(pooled))

    def forward(self, src_ids: Tensor, tgt_in: Tensor | None = None) -> Tensor:
        """Label logits of src_ids (B, S) as (B, 1, C): the first target position only."""
        _, logits = self.encode(src_ids, src_ids != self.cfg.pad_id)
        return logits[:, None, :]
