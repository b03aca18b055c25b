"""The two graphs of a bundle, as small explicit `nn.Module`s around a `Seq2SeqTransformer`.

    encoder = OnnxEncoder(model).eval()        # src_ids -> memory, cross_k.*, cross_v.*
    decoder = OnnxDecoderStep(model).eval()    # one KV-cached decoder step

Each wrapper's `forward` takes and returns exactly the graph's inputs and outputs, in the
order of `runtime/constants.py` (K/V as one tensor per decoder layer, tuples here, flattened
into `cross_k.0`, `cross_k.1`, ... by the exporter), and calls the model's own methods: no
patched `forward`, no second implementation of the model. Shapes use L = n_decoder_layers,
B = batch, H = n_heads, S = src_len, P = past_len, N = new_len, D = d_model, dh = d_head,
V = tgt vocab.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgeseq.build_model.model import Seq2SeqTransformer

from ...fused_ops import cached_self_attention, padded_attention
from ...fused_relative_ops import biased_cached_self_attention, biased_padded_attention

# (layer index, q, k, v) -> (attention output, present_k, present_v) of that layer
SelfAttention = Callable[[int, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


class OnnxEncoder(nn.Module):
    """Encoder graph: run once per input batch.

    Inputs:
        src_ids    int64   [B, S]         source ids, right-padded with pad_id; ends with `</s>`
    Outputs:
        memory     float32 [B, S, D]      encoder output (not needed by the decoder graph)
        cross_k.i  float32 [B, H, S, dh]  cross-attention keys of decoder layer i (L of them)
        cross_v.i  float32 [B, H, S, dh]  cross-attention values of decoder layer i

    Padding positions (src_ids == pad_id) are masked inside the graph.
    """

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        """src_ids (B, S) -> memory (B, S, D), L cross_k then L cross_v (B, H, S, dh)."""
        src_keep = self.model.source_keep(src_ids)  # (B, S) bool
        memory = self.model.encode(src_ids, src_keep)  # (B, S, D)
        cross_k, cross_v = self.model.cross_kv(memory)  # L-tuples of (B, H, S, dh)
        return (memory, *cross_k, *cross_v)


class OnnxDecoderStep(nn.Module):
    """Decoder-step graph: feeds N new target tokens after P cached ones.

    Inputs:
        input_ids    int64   [B, N]           new target ids at positions P..P+N-1
        past_k.i     float32 [B, H, P, dh]    self-attention keys so far of layer i (P may be 0)
        past_v.i     float32 [B, H, P, dh]    self-attention values so far of layer i
        cross_k.i    float32 [B, H, S, dh]    from the encoder graph
        cross_v.i    float32 [B, H, S, dh]    from the encoder graph
        src_mask     bool    [B, S]           True where the source token is real (not pad)
    Outputs:
        logits       float32 [B, N, V]        next-token scores for each new position
        present_k.i  float32 [B, H, P+N, dh]  past_k.i with the new tokens' keys appended
        present_v.i  float32 [B, H, P+N, dh]  past_v.i with the new tokens' values appended

    The position of the first new token is P, the cache length: rows P..P+N-1 of the
    positional table (an initializer) are added. The graph does not check P + N <= max_len;
    the caller must refuse longer sequences (slicing past the table yields too few rows).
    Each new token attends to every cached position and to the new tokens up to itself.
    """

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        past_k: tuple[Tensor, ...],
        past_v: tuple[Tensor, ...],
        cross_k: tuple[Tensor, ...],
        cross_v: tuple[Tensor, ...],
        src_mask: Tensor,
    ) -> tuple[Tensor, ...]:
        """One step -> logits (B, N, V), L present_k then L present_v (B, H, P+N, dh)."""
        logits, present_k, present_v = self.model.decode_step(
            input_ids, past_k, past_v, cross_k, cross_v, src_mask
        )
        return (logits, *present_k, *present_v)


def slot_bias(model: Seq2SeqTransformer, past_len: int | Tensor, new_len: int) -> Tensor | None:
    """The decoder's relative position bias (1, H, N, P+N) of N new tokens at cache slots
    P..P+N-1 over slots 0..P+N-1, computed once per step for every layer (None unless
    positional "relative"). Slot distances are position distances: a row's cache columns
    are contiguous, whichever column it starts at (runtime/serve/live_batch.py)."""
    if model.decoder_relative is None:
        return None
    q_pos = torch.arange(new_len) + past_len  # (N,)
    return model.decoder_relative(q_pos, torch.arange(past_len + new_len))


class FusedLinear(nn.Module):
    """Linear layers of one input side by side: one weight (sum of outputs, D) and one bias,
    concatenated from the model's layers when the wrapper is built (the model keeps its own).
    """

    def __init__(self, *linears: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("weight", torch.cat([x.weight.detach() for x in linears], dim=0))
        self.register_buffer("bias", torch.cat([x.bias.detach() for x in linears], dim=0))

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., sum of the layers' outputs)."""
        return F.linear(x, self.weight, self.bias)


class FusedEncoder(nn.Module):
    """`OnnxEncoder`'s graph (same inputs, outputs and arithmetic) with fused operators.

    Each self-attention is one Q/K/V projection (the three weights concatenated when the
    wrapper is built) and one `padded_attention` (a `com.microsoft` `MultiHeadAttention` node
    in ONNX; with positional "relative" `biased_padded_attention`, fed the stack's one score
    bias); the cross-attention K and V of every decoder layer are one projection of the
    memory per decoder layer. The model itself keeps its separate w_q/w_k/w_v.
    """

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model
        # Named like the model's layer lists: int8 groups weights by these module paths
        # (export/quantize.py), so decoder layer i's cross K/V stays in its group.
        attns = [layer.self_attn for layer in model.encoder_layers]
        self.encoder_layers = nn.ModuleList(FusedLinear(a.w_q, a.w_k, a.w_v) for a in attns)
        cross = [layer.cross_attn for layer in model.decoder_layers]
        self.decoder_layers = nn.ModuleList(FusedLinear(a.w_k, a.w_v) for a in cross)

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        """src_ids (B, S) -> memory (B, S, D), L cross_k then L cross_v (B, H, S, dh)."""
        model, cfg = self.model, self.model.cfg
        keep = model.source_keep(src_ids).to(torch.int32)  # (B, S)
        x = model.embed_source(src_ids)
        bias = None  # positional "relative": one (1, H, S, S) score bias for every layer
        if model.encoder_relative is not None:
            positions = torch.arange(src_ids.shape[1], device=src_ids.device)  # (S,)
            bias = model.encoder_relative(positions, positions)
        for i, layer in enumerate(model.encoder_layers):
            h = layer.sub_attn.inner(x)
            q, k, v = self.encoder_layers[i](h).split(cfg.n_heads * cfg.d_head, dim=-1)
            if bias is None:
                attn = padded_attention(q, k, v, keep, cfg.n_heads)
            else:
                attn = biased_padded_attention(q, k, v, keep, bias, cfg.n_heads)
            x = layer.sub_attn.outer(x, layer.self_attn.w_o(attn))
            x = layer.sub_ffn.outer(x, layer.ffn(layer.sub_ffn.inner(x)))
        memory = model.encoder_norm(x) if model.encoder_norm is not None else x
        b, s, _ = memory.shape
        cross_k, cross_v = [], []
        for project in self.decoder_layers:
            kv = project(memory).reshape(b, s, 2, cfg.n_heads, cfg.d_head)
            k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # two (B, H, S, dh)
            cross_k.append(k)
            cross_v.append(v)
        return (memory, *cross_k, *cross_v)


class FusedDecoderStep(nn.Module):
    """`OnnxDecoderStep`'s graph (same inputs, outputs and arithmetic) with fused operators.

    Self-attention is one Q/K/V projection and one `cached_self_attention` (a
    `MultiHeadAttention` node that appends the new keys and values to the cache itself; with
    positional "relative" `biased_cached_self_attention`, fed `slot_bias` once per step);
    cross-attention is the query projection and one `padded_attention` over the encoder's
    per-head K/V.
    """

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model
        attns = [layer.self_attn for layer in model.decoder_layers]
        self.decoder_layers = nn.ModuleList(FusedLinear(a.w_q, a.w_k, a.w_v) for a in attns)

    def forward(
        self,
        input_ids: Tensor,
        past_k: tuple[Tensor, ...],
        past_v: tuple[Tensor, ...],
        cross_k: tuple[Tensor, ...],
        cross_v: tuple[Tensor, ...],
        src_mask: Tensor,
    ) -> tuple[Tensor, ...]:
        """One step -> logits (B, N, V), L present_k then L present_v (B, H, P+N, dh)."""
        model, n_heads = self.model, self.model.cfg.n_heads
        past_len = past_k[0].shape[2]
        x = model.embed_target(input_ids, past_len)
        bias = slot_bias(model, past_len, input_ids.shape[1])

        def attend(i: int, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            if bias is None:
                return cached_self_attention(q, k, v, past_k[i], past_v[i], n_heads)
            return biased_cached_self_attention(q, k, v, past_k[i], past_v[i], bias, n_heads)

        return self.layers(x, attend, cross_k, cross_v, src_mask)

    def layers(
        self,
        x: Tensor,
        attend: SelfAttention,
        cross_k: tuple[Tensor, ...],
        cross_v: tuple[Tensor, ...],
        src_mask: Tensor,
        per_input: bool = False,
    ) -> tuple[Tensor, ...]:
        """The decoder layers on embedded x (B, N, D), self-attention by `attend(i, q, k, v)`
        -> (attention (B, N, D), present_k, present_v) for layer i -> logits (B, N, V), L
        present_k then L present_v.

        `per_input`: cross K/V (I, H, S, dh) and src_mask (I, S) hold one row per input, whose
        B / I rows are consecutive in x (an input's beam hypotheses): each input's queries
        attend to its keys as one (B / I) x S attention instead of B / I separate ones."""
        model, cfg = self.model, self.model.cfg
        keep = src_mask.to(torch.int32)  # (B, S), or (I, S) per input
        present_k, present_v = [], []
        for i, layer in enumerate(model.decoder_layers):
            h = layer.sub_self.inner(x)
            q, k, v = self.decoder_layers[i](h).split(cfg.n_heads * cfg.d_head, dim=-1)
            attn, k, v = attend(i, q, k, v)
            present_k.append(k)
            present_v.append(v)
            x = layer.sub_self.outer(x, layer.self_attn.w_o(attn))
            q = layer.cross_attn.w_q(layer.sub_cross.inner(x))
            if per_input:  # (B, N, D) -> (I, B / I * N, D) and back
                grouped = q.reshape(cross_k[i].shape[0], -1, q.shape[-1])
                attn = padded_attention(grouped, cross_k[i], cross_v[i], keep, cfg.n_heads)
                attn = attn.reshape(q.shape)
            else:
                attn = padded_attention(q, cross_k[i], cross_v[i], keep, cfg.n_heads)
            x = layer.sub_cross.outer(x, layer.cross_attn.w_o(attn))
            x = layer.sub_ffn.outer(x, layer.ffn(layer.sub_ffn.inner(x)))
        if model.decoder_norm is not None:
            x = model.decoder_norm(x)
        return (model.output(x), *present_k, *present_v)
