"""GPT and BERT from the encoder–decoder's blocks (build_model/model.py): the decoder-only and
encoder-only architectures of `ModelConfig.architecture`.

    gpt = DecoderOnlyTransformer(cfg)      # cfg.architecture == "decoder-only"
    logits, k, v = gpt.step(input_ids, position_ids, attention_mask, past_k, past_v)
    bert = EncoderOnlyTransformer(cfg)     # cfg.architecture == "encoder-only"
    hidden, logits = bert.encode(input_ids, attention_mask)   # (B, S, D), (B, C)
    model = build_transformer(cfg)         # whichever class cfg.architecture names

A GPT block is an `EncoderLayer` run through `forward_cached` with a causal mask; a BERT
block is an `EncoderLayer` with the bidirectional padding mask. Both models also take
`forward(src_ids, tgt_in)` like `Seq2SeqTransformer`, so one training loop trains all three:
GPT models `tgt_in` (src_ids is unused), BERT classifies `src_ids` into one label, returned
as (B, 1, C) logits for the first target position.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from edgeseq.runtime.config import ModelConfig

from .model import Cache, EncoderLayer, PositionalEncoding, Seq2SeqTransformer, TokenEmbedding


def _init_linears(model: nn.Module, skip: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every Linear but `skip` (as Seq2Seq)."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not skip:
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)


def _final_norm(cfg: ModelConfig) -> nn.LayerNorm | None:
    """Pre-norm stacks end with a LayerNorm; post-norm ones are already normalised."""
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else None


class DecoderOnlyTransformer(nn.Module):
    """GPT: token embedding x sqrt(d) + positional table rows, `n_decoder_layers` causal
    self-attention + FFN blocks with a KV cache, final linear over the one vocabulary."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model)
        self.pos = PositionalEncoding(cfg.max_len, cfg.d_model, cfg.positional)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.norm = _final_norm(cfg)
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=not cfg.tie_output)
        if cfg.tie_output:
            self.output.weight = self.embed.weight
        _init_linears(self, self.output)

    def empty_cache(self, batch: int, like: Tensor) -> tuple[Cache, Cache]:
        """An empty cache: two L-tuples of (B, H, 0, dh) tensors."""
        cfg = self.cfg
        empty = like.new_zeros((batch, cfg.n_heads, 0, cfg.d_head), dtype=torch.float32)
        return (empty,) * cfg.n_decoder_layers, (empty,) * cfg.n_decoder_layers

    def step(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        attention_mask: Tensor,
        past_k: Cache,
        past_v: Cache,
    ) -> tuple[Tensor, Cache, Cache]:
        """New tokens over a cache (the graph of a GPT bundle).

        input_ids (B, N) int64 at cache slots P..P+N-1; position_ids (B, N) int64 rows of the
        positional table; attention_mask (B, P+N) int64 or bool, nonzero at real tokens (pads
        anywhere: left or right padding); past_k/past_v L-tuples of (B, H, P, dh) -> logits
        (B, N, V) and present_k/v, L-tuples of (B, H, P+N, dh). Slot j is visible from slot i
        when j <= i and attention_mask[:, j] is set; every slot sees itself, so a pad row
        stays finite.
        """
        past_len, new_len = past_k[0].shape[2], input_ids.shape[1]
        x = self.dropout(self.pos.at(self.embed(input_ids), position_ids))
        q_slot = torch.arange(new_len, device=input_ids.device) + past_len  # (N,)
        k_slot = torch.arange(past_len + new_len, device=input_ids.device)  # (P+N,)
        causal = k_slot[None, :] <= q_slot[:, None]  # (N, P+N)
        itself = k_slot[None, :] == q_slot[:, None]
        keep = (causal[None, None] & (attention_mask != 0)[:, None, None, :]) | itself[None, None]
        present_k, present_v = [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer.forward_cached(x, past_k[i], past_v[i], keep)
            present_k.append(k)
            present_v.append(v)
        if self.norm is not None:
            x = self.norm(x)
        return self.output(x), tuple(present_k), tuple(present_v)

    def forward(self, src_ids: Tensor | None, tgt_in: Tensor) -> Tensor:
        """Next-token logits of right-padded tgt_in (B, T) -> (B, T, V); src_ids is unused."""
        batch, length = tgt_in.shape
        positions = torch.arange(length, device=tgt_in.device)[None].expand(batch, length)
        past_k, past_v = self.empty_cache(batch, self.output.weight)
        logits, _, _ = self.step(tgt_in, positions, tgt_in != self.cfg.pad_id, past_k, past_v)
        return logits


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
        self.norm = _final_norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.tgt_vocab_size)
        _init_linears(self, self.head)

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


Model = Seq2SeqTransformer | DecoderOnlyTransformer | EncoderOnlyTransformer


def build_transformer(cfg: ModelConfig) -> Model:
    """The model class `cfg.architecture` names, freshly initialised."""
    if cfg.architecture == "decoder-only":
        return DecoderOnlyTransformer(cfg)
    if cfg.architecture == "encoder-only":
        return EncoderOnlyTransformer(cfg)
    return Seq2SeqTransformer(cfg)
