"""A translation model in the shape of PyTorch's tutorial "Language Translation with
nn.Transformer and torchtext": a scaled `TokenEmbedding`, a `PositionalEncoding` buffer, a
`torch.nn.Transformer` and a `generator` Linear. edgeseq exports it as it is (see
torch_source.json and docs); nothing here knows about edgeseq.

    model = build(src_vocab_size=40, tgt_vocab_size=40)
    logits = model(src, tgt, None, tgt_mask, src_pad, tgt_pad, src_pad)   # (T, B, V)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    """Adds the paper's sinusoidal table (a buffer) to token embeddings, then dropout."""

    def __init__(
        self, emb_size: int, dropout: float, maxlen: int = 5000, batch_first: bool = False
    ) -> None:
        super().__init__()
        den = torch.exp(-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        self.batch_first = batch_first
        self.dropout = nn.Dropout(dropout)
        # (1, maxlen, D) batch first, else (maxlen, 1, D) as in the tutorial
        shape = (1, maxlen, emb_size) if batch_first else (maxlen, 1, emb_size)
        self.register_buffer("pos_embedding", pos_embedding.reshape(shape))

    def forward(self, token_embedding: Tensor) -> Tensor:
        if self.batch_first:
            return self.dropout(token_embedding + self.pos_embedding[:, : token_embedding.size(1)])
        return self.dropout(token_embedding + self.pos_embedding[: token_embedding.size(0)])


class TokenEmbedding(nn.Module):
    """Token ids -> embeddings x sqrt(emb_size)."""

    def __init__(self, vocab_size: int, emb_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens: Tensor) -> Tensor:
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2SeqTransformer(nn.Module):
    """The tutorial's model (options beyond it: batch_first, norm_first, activation, tie)."""

    def __init__(
        self,
        num_encoder_layers: int,
        num_decoder_layers: int,
        emb_size: int,
        nhead: int,
        src_vocab_size: int,
        tgt_vocab_size: int,
        dim_feedforward: int = 512,
        dropout: float = 0.1,
        maxlen: int = 5000,
        batch_first: bool = False,
        norm_first: bool = False,
        activation: str = "relu",
        tie: bool = False,
    ) -> None:
        super().__init__()
        self.transformer = nn.Transformer(
            d_model=emb_size,
            nhead=nhead,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            activation=activation,
            batch_first=batch_first,
            norm_first=norm_first,
        )
        self.generator = nn.Linear(emb_size, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size)
        if tie:
            self.generator.weight = self.tgt_tok_emb.embedding.weight
        self.positional_encoding = PositionalEncoding(emb_size, dropout, maxlen, batch_first)

    def forward(
        self,
        src: Tensor,
        trg: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor,
        src_padding_mask: Tensor,
        tgt_padding_mask: Tensor,
        memory_key_padding_mask: Tensor,
    ) -> Tensor:
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
        outs = self.transformer(
            src_emb,
            tgt_emb,
            src_mask,
            tgt_mask,
            None,
            src_padding_mask,
            tgt_padding_mask,
            memory_key_padding_mask,
        )
        return self.generator(outs)


def build(
    src_vocab_size: int = 40,
    tgt_vocab_size: int = 40,
    emb_size: int = 64,
    nhead: int = 4,
    num_encoder_layers: int = 2,
    num_decoder_layers: int = 2,
    dim_feedforward: int = 128,
    **options: object,
) -> Seq2SeqTransformer:
    """The factory edgeseq calls (torch_source.json's "factory")."""
    return Seq2SeqTransformer(
        num_encoder_layers,
        num_decoder_layers,
        emb_size,
        nhead,
        src_vocab_size,
        tgt_vocab_size,
        dim_feedforward,
        **options,  # type: ignore[arg-type]
    )
