"""The Transformer of "Attention is all you need", written out explicitly.

    model = Seq2SeqTransformer(ModelConfig(src_vocab_size=40, tgt_vocab_size=80))
    memory = model.encode(src_ids)                          # (B, S, D)
    logits = model.decode(tgt_in, memory, src_keep)         # (B, T, V), training, uncached
    cross_k, cross_v = model.cross_kv(memory)               # L-tuples of (B, H, S, dh), once
    logits, k, v = model.decode_step(ids, past_k, past_v, cross_k, cross_v, src_keep)

Masks are boolean "keep" tensors: True where attention may look (a real token, or a position
not in the future). Sources end with `</s>`; targets start with `<s>`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import InputTooLongError

from .relative import RelativePositionBias
from .sublayers import make_ffn, make_norm

Cache = tuple[Tensor, ...]  # one (B, H, T, dh) tensor per decoder layer


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...): (max_len, d_model)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, ceil(D/2))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


def sinusoidal_halves_table(max_len: int, d_model: int) -> Tensor:
    """Marian's table: the same angles, sines in the first ceil(D/2) columns and cosines in the
    rest ([sin half | cos half], not interleaved), positions from 0: (max_len, d_model)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, ceil(D/2))
    table = torch.cat([torch.sin(angle), torch.cos(angle[:, : d_model // 2])], dim=1)
    return table.float()


POSITIONAL_TABLES = {"sinusoidal": sinusoidal_table, "sinusoidal-halves": sinusoidal_halves_table}


class TokenEmbedding(nn.Module):
    """Token ids -> vectors scaled by sqrt(d_model) (`scale=False`: unscaled)."""

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * d_model**-0.5)
        self.scale = math.sqrt(d_model) if scale else None

    def forward(self, ids: Tensor) -> Tensor:
        """(B, T) int64 -> (B, T, D)."""
        x = F.embedding(ids, self.weight)
        return x * self.scale if self.scale is not None else x


class PositionalEncoding(nn.Module):
    """Adds row `offset + t` of a (max_len, D) table to position t: learned, or a fixed
    sinusoidal table (POSITIONAL_TABLES); "relative" adds nothing (the positions enter the
    attention scores, build_model/relative.py) and has no length limit."""

    def __init__(self, max_len: int, d_model: int, kind: str = "sinusoidal") -> None:
        super().__init__()
        self.max_len = max_len
        self.table: Tensor | None
        if kind == "relative":
            self.table = None
        elif kind == "learned":
            self.table = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        else:
            self.register_buffer("table", POSITIONAL_TABLES[kind](max_len, d_model))

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """(B, T, D) -> (B, T, D) with positions offset..offset+T-1 added."""
        length = x.shape[1]
        limited = self.table is not None  # "relative": no table, no limit (T5's)
        if (
            limited
            and isinstance(offset, int)
            and isinstance(length, int)
            and offset + length > self.max_len
        ):
            raise InputTooLongError(
                f"sequence needs {offset + length} positions but the model's max_len is "
                f"{self.max_len}; shorten the input or train with a larger max_len"
            )
        return x if self.table is None else x + self.table[offset : offset + length]

    def at(self, x: Tensor, position_ids: Tensor) -> Tensor:
        """x (B, T, D) plus the table rows of position_ids (B, T) int64 (a gather)."""
        return x if self.table is None else x + self.table[position_ids]


class MultiHeadAttention(nn.Module):
    """softmax(Q Kᵀ / sqrt(d_k)) V over n_heads heads, heads concatenated, times W_O. Heads
    are d_head wide (default d_model / n_heads); Q, K, V have n_heads * d_head features."""

    def __init__(
        self, d_model: int, n_heads: int, dropout: float, d_head: int | None = None
    ) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head or d_model // n_heads
        inner = n_heads * self.d_head
        self.w_q = nn.Linear(d_model, inner)
        self.w_k = nn.Linear(d_model, inner)
        self.w_v = nn.Linear(d_model, inner)
        self.w_o = nn.Linear(inner, d_model)
        self.dropout = nn.Dropout(dropout)

    def split(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, dh)."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def merge(self, x: Tensor) -> Tensor:
        """(B, H, T, dh) -> (B, T, D)."""
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.n_heads * self.d_head)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `x` (B, S, D): two (B, H, S, dh)."""
        return self.split(self.w_k(x)), self.split(self.w_v(x))

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        """q (B, H, T, dh), k/v (B, H, S, dh), keep and the optional additive score bias
        (relative positions) broadcastable to (B, H, T, S) -> (B, T, D)."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, S)
        if bias is not None:
            scores = scores + bias
        scores = scores.masked_fill(~keep, float("-inf"))
        weights = self.dropout(torch.softmax(scores, dim=-1))
        return self.w_o(self.merge(weights @ v))

    def forward(self, x: Tensor, kv: Tensor, keep: Tensor, bias: Tensor | None = None) -> Tensor:
        """Queries from x (B, T, D), keys/values from kv (B, S, D), optional score bias
        (1, H, T, S) -> (B, T, D)."""
        k, v = self.project_kv(kv)
        return self.attend(self.split(self.w_q(x)), k, v, keep, bias)

    def forward_cached(
        self, x: Tensor, past_k: Tensor, past_v: Tensor, keep: Tensor, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention of new tokens x (B, N, D) over past (B, H, P, dh) plus themselves,
        optional score bias (1, H, N, P+N).

        Returns the output (B, N, D) and the extended cache, two (B, H, P+N, dh).
        """
        k_new, v_new = self.project_kv(x)
        k = torch.cat([past_k, k_new], dim=2)
        v = torch.cat([past_v, v_new], dim=2)
        return self.attend(self.split(self.w_q(x)), k, v, keep, bias), k, v


class Sublayer(nn.Module):
    """Add & norm around f: post-norm LN(x + f(x)) or pre-norm x + f(LN(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)  # LayerNorm or RMSNorm (cfg.norm_type), (..., D)
        self.pre = cfg.norm == "pre"
        self.dropout = nn.Dropout(cfg.dropout)

    def inner(self, x: Tensor) -> Tensor:
        """The input f sees: LN(x) in pre-norm, x in post-norm."""
        return self.norm(x) if self.pre else x

    def outer(self, x: Tensor, fx: Tensor) -> Tensor:
        """Residual sum (normalised in post-norm)."""
        y = x + self.dropout(fx)
        return y if self.pre else self.norm(y)


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each wrapped in add & norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.d_head)
        self.ffn = make_ffn(cfg)  # plain or gated (cfg.ffn), (B, T, D) -> (B, T, D)
        self.sub_attn, self.sub_ffn = Sublayer(cfg), Sublayer(cfg)

    def forward(self, x: Tensor, keep: Tensor, bias: Tensor | None = None) -> Tensor:
        """x (B, S, D), keep (B, 1, 1, S), optional score bias (1, H, S, S) -> (B, S, D)."""
        h = self.sub_attn.inner(x)
        return self.feed_forward(self.sub_attn.outer(x, self.self_attn(h, h, keep, bias)))

    def forward_cached(
        self, x: Tensor, past_k: Tensor, past_v: Tensor, keep: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The same block over new tokens x (B, N, D) attending to a cache (B, H, P, dh) and
        themselves, keep broadcastable to (B, H, N, P+N) (a GPT block when keep is causal)
        -> x (B, N, D) and the extended cache, two (B, H, P+N, dh)."""
        attn, k, v = self.self_attn.forward_cached(self.sub_attn.inner(x), past_k, past_v, keep)
        return self.feed_forward(self.sub_attn.outer(x, attn)), k, v

    def feed_forward(self, x: Tensor) -> Tensor:
        """The FFN sublayer with its add & norm: (B, T, D) -> (B, T, D)."""
        return self.sub_ffn.outer(x, self.ffn(self.sub_ffn.inner(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the memory, FFN; each with add & norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.d_head)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.d_head)
        self.ffn = make_ffn(cfg)  # plain or gated (cfg.ffn), (B, T, D) -> (B, T, D)
        self.sub_self, self.sub_cross, self.sub_ffn = Sublayer(cfg), Sublayer(cfg), Sublayer(cfg)

    def forward(
        self,
        x: Tensor,
        past_k: Tensor,
        past_v: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        self_keep: Tensor,
        cross_keep: Tensor,
        self_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, N, D); past (B, H, P, dh); cross (B, H, S, dh); self_keep (B|1, 1, N, P+N);
        cross_keep (B, 1, 1, S); optional self-attention score bias (1, H, N, P+N) -> x
        (B, N, D) and the cache, two (B, H, P+N, dh)."""
        h = self.sub_self.inner(x)
        attn, k, v = self.self_attn.forward_cached(h, past_k, past_v, self_keep, self_bias)
        x = self.sub_self.outer(x, attn)
        q = self.cross_attn.split(self.cross_attn.w_q(self.sub_cross.inner(x)))
        x = self.sub_cross.outer(x, self.cross_attn.attend(q, cross_k, cross_v, cross_keep))
        return self.sub_ffn.outer(x, self.ffn(self.sub_ffn.inner(x))), k, v


class Seq2SeqTransformer(nn.Module):
    """Encoder–decoder Transformer with an incremental, KV-cached decoder step."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.src_embed = TokenEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.scale_embedding)
        self.tgt_embed = TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.scale_embedding)
        self.src_pos = PositionalEncoding(cfg.max_len, cfg.d_model, cfg.positional)
        self.tgt_pos = PositionalEncoding(cfg.max_len, cfg.d_model, cfg.positional)
        # BART's layernorm_embedding (cfg.embedding_norm): a norm on embedding + position
        self.src_embed_norm = make_norm(cfg) if cfg.embedding_norm else None
        self.tgt_embed_norm = make_norm(cfg) if cfg.embedding_norm else None
        # positional "relative": one bias table per stack, shared by its layers (T5's)
        relative = cfg.positional == "relative"
        self.encoder_relative = RelativePositionBias(cfg, True) if relative else None
        self.decoder_relative = RelativePositionBias(cfg, False) if relative else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        # Pre-norm needs a final LayerNorm on each stack; nn.Transformer has one in post-norm too.
        final = cfg.has_final_norm
        self.encoder_norm = make_norm(cfg) if final else None
        self.decoder_norm = make_norm(cfg) if final else None
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.has_output_bias)
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.weight
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear) and module is not self.output:
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        if self.cfg.tie_output and self.output.bias is not None:
            nn.init.zeros_(self.output.bias)  # Marian's final_logits_bias starts at zero too

    # -- encoder ----------------------------------------------------------------------------
    def source_keep(self, src_ids: Tensor) -> Tensor:
        """(B, S) int64 -> (B, S) bool, True at real (non-pad) tokens."""
        return src_ids != self.cfg.pad_id

    def encode(self, src_ids: Tensor, src_keep: Tensor | None = None) -> Tensor:
        """src_ids (B, S) int64 -> memory (B, S, D)."""
        if src_keep is None:
            src_keep = self.source_keep(src_ids)
        x = self.embed_source(src_ids)
        keep = src_keep[:, None, None, :]  # (B, 1, 1, S)
        bias = None
        if self.encoder_relative is not None:
            positions = torch.arange(src_ids.shape[1], device=src_ids.device)  # (S,)
            bias = self.encoder_relative(positions, positions)  # (1, H, S, S)
        for layer in self.encoder_layers:
            x = layer(x, keep, bias)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def embed_source(self, src_ids: Tensor) -> Tensor:
        """src_ids (B, S) int64 -> the encoder's input (B, S, D): token embedding + position,
        normalised when cfg.embedding_norm, then dropout."""
        x = self.src_pos(self.src_embed(src_ids))
        return self.dropout(self.src_embed_norm(x) if self.src_embed_norm is not None else x)

    def cross_kv(self, memory: Tensor) -> tuple[Cache, Cache]:
        """memory (B, S, D) -> cross-attention K and V of each decoder layer: two L-tuples of
        (B, H, S, dh)."""
        pairs = [layer.cross_attn.project_kv(memory) for layer in self.decoder_layers]
        return tuple(k for k, _ in pairs), tuple(v for _, v in pairs)

    # -- decoder ----------------------------------------------------------------------------
    def empty_cache(self, batch: int, like: Tensor) -> tuple[Cache, Cache]:
        """An empty self-attention cache: two L-tuples of (B, H, 0, dh) tensors."""
        cfg = self.cfg
        empty = like.new_zeros((batch, cfg.n_heads, 0, cfg.d_head))
        return (empty,) * cfg.n_decoder_layers, (empty,) * cfg.n_decoder_layers

    def embed_target(
        self, input_ids: Tensor, offset: int | Tensor = 0, position_ids: Tensor | None = None
    ) -> Tensor:
        """input_ids (B, N) int64 -> the decoder's input (B, N, D): token embedding + the
        positions offset..offset+N-1 (or the rows position_ids (B, N) int64), normalised when
        cfg.embedding_norm, then dropout."""
        embedded = self.tgt_embed(input_ids)
        if position_ids is None:
            x = self.tgt_pos(embedded, offset=offset)
        else:
            x = self.tgt_pos.at(embedded, position_ids)
        return self.dropout(self.tgt_embed_norm(x) if self.tgt_embed_norm is not None else x)

    def decode_step(
        self,
        input_ids: Tensor,
        past_k: Sequence[Tensor],
        past_v: Sequence[Tensor],
        cross_k: Sequence[Tensor],
        cross_v: Sequence[Tensor],
        src_keep: Tensor,
        tgt_keep: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Cache, Cache]:
        """One incremental step. K/V come as one tensor per decoder layer (L of each).

        input_ids (B, N) int64 at cache slots P..P+N-1, past_k/past_v (B, H, P, dh) each,
        cross_k/cross_v (B, H, S, dh) each, src_keep (B, S) bool, optional tgt_keep (B, P+N)
        bool hiding cache slots (padding, or slots of no use to a row), optional position_ids
        (B, N) int64 rows of the positional table (default: positions P..P+N-1, the slots)
        -> logits (B, N, V), present_k/v: L-tuples of (B, H, P+N, dh). Slot j is visible
        from new slot i when j <= i and tgt_keep[:, j]; with both options, rows of one batch
        can be at different positions (continuous batching: export/kinds/seq2seq/steps_graph.py).
        """
        past_len, new_len = past_k[0].shape[2], input_ids.shape[1]
        x = self.embed_target(input_ids, past_len, position_ids)
        q_pos = torch.arange(new_len, device=input_ids.device) + past_len  # (N,)
        k_pos = torch.arange(past_len + new_len, device=input_ids.device)  # (P+N,)
        self_keep = (k_pos[None, :] <= q_pos[:, None])[None, None]  # (1, 1, N, P+N)
        if tgt_keep is not None:
            self_keep = self_keep & tgt_keep[:, None, None, :]
        cross_keep = src_keep[:, None, None, :]  # (B, 1, 1, S)
        bias = None  # relative positions: of the slots (position_ids are not supported)
        if self.decoder_relative is not None:
            bias = self.decoder_relative(q_pos, k_pos)  # (1, H, N, P+N)
        present_k, present_v = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, k, v = layer(
                x, past_k[i], past_v[i], cross_k[i], cross_v[i], self_keep, cross_keep, bias
            )
            present_k.append(k)
            present_v.append(v)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.output(x), tuple(present_k), tuple(present_v)

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_keep: Tensor) -> Tensor:
        """Full (uncached) decode for training: tgt_ids (B, T), memory (B, S, D) -> (B, T, V)."""
        cross_k, cross_v = self.cross_kv(memory)
        past_k, past_v = self.empty_cache(tgt_ids.shape[0], memory)
        tgt_keep = tgt_ids != self.cfg.pad_id
        return self.decode_step(tgt_ids, past_k, past_v, cross_k, cross_v, src_keep, tgt_keep)[0]

    def forward(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        """Teacher-forced logits: src_ids (B, S), tgt_ids (B, T) starting with <s> -> (B, T, V)."""
        src_keep = self.source_keep(src_ids)
        return self.decode(tgt_ids, self.encode(src_ids, src_keep), src_keep)


# -- shared by the one-stack kinds (build_model/decoder_only.py, encoder_only.py) --------
def init_linears(model: nn.Module, skip: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every Linear but `skip` (as Seq2Seq)."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not skip:
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)


def final_norm(cfg: ModelConfig) -> nn.Module | None:
    """The norm (`make_norm`) that ends a stack when `cfg.has_final_norm` (pre-norm stacks by
    default; post-norm ones are already normalised unless `final_norm` asks for one)."""
    return make_norm(cfg) if cfg.has_final_norm else None
