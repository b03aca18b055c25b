"""Attention operators that export as onnxruntime's `com.microsoft` attention nodes.

    out, present_k, present_v = cached_self_attention(q, k, v, past_k, past_v, n_heads)
    out = padded_attention(q, k, v, keep, n_heads)
    out, present_k, present_v = masked_self_attention(q, k, v, past_k, past_v, keep, n_heads)
    out, cache_k, cache_v = in_place_self_attention(q, k, v, keep, cache_k, cache_v,
                                                    past_len, beam_width, indirection, n_heads)

Each is a `torch.library` custom op: in PyTorch it runs a reference implementation (the same
arithmetic as `build_model.model.MultiHeadAttention.attend`), and `TRANSLATIONS` maps it to
one `MultiHeadAttention` node for `torch.onnx.export(custom_translation_table=...)`. The node
does the head split and merge, the scaling, the masking, the softmax, both products and
(self-attention) the cache concatenation, which the plain export spells as a dozen nodes.
The last is `DecoderMaskedMultiHeadAttention` with a shared past/present buffer: the cache
is a preallocated (B, H, M, dh) buffer that the node writes the new key and value into, and
beam search reorders hypotheses through a cache indirection instead of copying the cache.
Shapes: B batch, N new tokens, P cached tokens, S keys, H heads, dh head size, D = H * dh,
M cache buffer length, W beam width.
"""

from __future__ import annotations

import math

import onnxscript
import torch
from onnxscript import FLOAT, INT32
from onnxscript import opset18 as op
from onnxscript.values import Opset
from torch import Tensor

MS = Opset("com.microsoft", 1)
MS_DOMAIN = "com.microsoft"
FUSED_OP = "MultiHeadAttention"  # the node type a fused graph contains


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, T, D) -> (B, H, T, dh)."""
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).transpose(1, 2)


def attend_heads(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, bias: Tensor | None = None
) -> Tensor:
    """q (B, H, T, dh), k/v (B, H, S, dh), keep and the optional score bias broadcastable to
    (B, H, T, S) -> (B, T, D)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    out = weights @ v  # (B, H, T, dh)
    b, h, t, dh = out.shape
    return out.transpose(1, 2).reshape(b, t, h * dh)


@torch.library.custom_op("edgeseq::cached_self_attention", mutates_args=())
def cached_self_attention(
    q: Tensor, k: Tensor, v: Tensor, past_k: Tensor, past_v: Tensor, n_heads: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Causal self-attention of N new tokens over P cached ones plus themselves.

    q/k/v (B, N, D) projected, bias included; past_k/past_v (B, H, P, dh) ->
    out (B, N, D) before the output projection, present_k/present_v (B, H, P+N, dh)."""
    return cached_reference(q, k, v, past_k, past_v, None, None, n_heads)


def cached_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    past_k: Tensor,
    past_v: Tensor,
    keep: Tensor | None,
    bias: Tensor | None,
    n_heads: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The arithmetic of the cached self-attention ops: causal over P + N slots, `keep`
    (B, P+N) int32 hiding slots, `bias` (1 or B, H, N, P+N) added to the scores (each
    optional) -> out (B, N, D), present_k/present_v (B, H, P+N, dh)."""
    keys = torch.cat([past_k, split_heads(k, n_heads)], dim=2)
    values = torch.cat([past_v, split_heads(v, n_heads)], dim=2)
    past, new = past_k.shape[2], q.shape[1]
    q_pos = torch.arange(new, device=q.device) + past
    mask = torch.arange(past + new, device=q.device)[None, :] <= q_pos[:, None]  # (N, P+N)
    if keep is not None:
        mask = mask[None, None] & keep.bool()[:, None, None, :]  # (B, 1, N, P+N)
    return attend_heads(split_heads(q, n_heads), keys, values, mask, bias), keys, values


@cached_self_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, past_k: Tensor, past_v: Tensor, n_heads: int):
    b, h, p, dh = past_k.shape
    total = p + q.shape[1]
    return q.new_empty(q.shape), q.new_empty((b, h, total, dh)), q.new_empty((b, h, total, dh))


@torch.library.custom_op("edgeseq::masked_self_attention", mutates_args=())
def masked_self_attention(
    q: Tensor, k: Tensor, v: Tensor, past_k: Tensor, past_v: Tensor, keep: Tensor, n_heads: int
) -> tuple[Tensor, Tensor, Tensor]:
    """`cached_self_attention` with a key mask over the cache slots and the new tokens.

    keep (B, P+N) int32, 1 at slots a row may attend to (the causal rule still applies) ->
    out (B, N, D), present_k/present_v (B, H, P+N, dh)."""
    return cached_reference(q, k, v, past_k, past_v, keep, None, n_heads)


@masked_self_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, past_k: Tensor, past_v: Tensor, keep: Tensor, n_heads: int):
    b, h, p, dh = past_k.shape
    total = p + q.shape[1]
    return q.new_empty(q.shape), q.new_empty((b, h, total, dh)), q.new_empty((b, h, total, dh))


@torch.library.custom_op("edgeseq::padded_attention", mutates_args=())
def padded_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, n_heads: int) -> Tensor:
    """Attention over keys some of which are padding.

    q (B, T, D); k/v (B, S, D) projected, or (B, H, S, dh) already split into heads;
    keep (B, S) int32, 1 at real keys -> out (B, T, D) before the output projection."""
    if k.dim() == 3:
        k, v = split_heads(k, n_heads), split_heads(v, n_heads)
    return attend_heads(split_heads(q, n_heads), k, v, keep.bool()[:, None, None, :])


@padded_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, n_heads: int):
    return q.new_empty(q.shape)


@torch.library.custom_op("edgeseq::in_place_self_attention", mutates_args=())
def in_place_self_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor,
    cache_k: Tensor,
    cache_v: Tensor,
    past_len: Tensor,
    beam_width: Tensor,
    indirection: Tensor,
    n_heads: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Self-attention of one new token per row over a cache kept in a (B, H, M, dh) buffer.

    q/k/v (B, 1, D) projected; keep (B, P+1) int32, 1 at slots a row may attend to;
    cache_k/cache_v (B, H, M, dh) with P = past_len[0] positions filled; beam_width (1,) W;
    indirection (B/W, W, M) int32: row n*W + w reads position t from buffer row
    n*W + indirection[n, w, t] (only read with W > 1) -> out (B, 1, D), and the buffers with
    the new key and value written at position P of each row (in ONNX the same memory)."""
    return in_place_reference(
        q, k, v, keep, None, cache_k, cache_v, past_len, beam_width, indirection, n_heads
    )


def in_place_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor,
    bias: Tensor | None,
    cache_k: Tensor,
    cache_v: Tensor,
    past_len: Tensor,
    beam_width: Tensor,
    indirection: Tensor,
    n_heads: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The arithmetic of the in-place ops (see `in_place_self_attention`), `bias` (1 or B,
    H, 1, P+1) added to the scores when given."""
    past, width = int(past_len.reshape(-1)[0]), int(beam_width.reshape(-1)[0])
    rows = torch.arange(q.shape[0], device=q.device)
    if width > 1:  # (B, P): the buffer row holding each row's position t
        offsets = indirection.reshape(-1, cache_k.shape[2])[:, :past]
        held = (rows // width * width)[:, None] + offsets
    else:
        held = rows[:, None].expand(-1, past)
    positions = torch.arange(past, device=q.device)
    new_k, new_v = split_heads(k, n_heads), split_heads(v, n_heads)  # (B, H, 1, dh)
    keys = torch.cat([cache_k[held, :, positions].transpose(1, 2), new_k], dim=2)
    values = torch.cat([cache_v[held, :, positions].transpose(1, 2), new_v], dim=2)
    out = attend_heads(split_heads(q, n_heads), keys, values, keep.bool()[:, None, None, :], bias)
    present_k, present_v = cache_k.clone(), cache_v.clone()
    present_k[:, :, past] = new_k[:, :, 0]
    present_v[:, :, past] = new_v[:, :, 0]
    return out, present_k, present_v


@in_place_self_attention.register_fake
def _(q, k, v, keep, cache_k, cache_v, past_len, beam_width, indirection, n_heads):
    return q.new_empty(q.shape), cache_k.new_empty(cache_k.shape), cache_v.new_empty(cache_v.shape)


@onnxscript.script(MS, default_opset=op)
def _cached_self_attention_onnx(
    q: FLOAT, k: FLOAT, v: FLOAT, past_k: FLOAT, past_v: FLOAT, n_heads: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """ONNX translation of `cached_self_attention`: one MultiHeadAttention node."""
    out, present_k, present_v = MS.MultiHeadAttention(
        q,
        k,
        v,
        None,
        None,
        None,
        past_k,
        past_v,
        num_heads=n_heads,
        unidirectional=1,
        mask_filter_value=-1e30,
    )
    return out, present_k, present_v


@onnxscript.script(MS, default_opset=op)
def _masked_self_attention_onnx(
    q: FLOAT, k: FLOAT, v: FLOAT, past_k: FLOAT, past_v: FLOAT, keep: INT32, n_heads: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """ONNX translation of `masked_self_attention`: one MultiHeadAttention node, causal, with
    a key padding mask of past + new length (onnxruntime's CPU kernel takes it with a cache)."""
    out, present_k, present_v = MS.MultiHeadAttention(
        q,
        k,
        v,
        None,
        keep,
        None,
        past_k,
        past_v,
        num_heads=n_heads,
        unidirectional=1,
        mask_filter_value=-1e30,
    )
    return out, present_k, present_v


@onnxscript.script(MS, default_opset=op)
def _padded_attention_onnx(q: FLOAT, k: FLOAT, v: FLOAT, keep: INT32, n_heads: int) -> FLOAT:
    """ONNX translation of `padded_attention`: one MultiHeadAttention node with a key
    padding mask (4-D k/v are taken as already split into heads)."""
    out = MS.MultiHeadAttention(q, k, v, None, keep, num_heads=n_heads, mask_filter_value=-1e30)
    return out


@onnxscript.script(MS, default_opset=op)
def _in_place_self_attention_onnx(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    keep: INT32,
    cache_k: FLOAT,
    cache_v: FLOAT,
    past_len: INT32,
    beam_width: INT32,
    indirection: INT32,
    n_heads: int,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """ONNX translation of `in_place_self_attention`: one DecoderMaskedMultiHeadAttention
    node whose past and present share one buffer (bind the same OrtValue to both)."""
    out, present_k, present_v = MS.DecoderMaskedMultiHeadAttention(
        q,
        k,
        v,
        keep,
        None,
        cache_k,
        cache_v,
        past_len,
        beam_width,
        indirection,
        num_heads=n_heads,
        past_present_share_buffer=1,
        mask_filter_value=-1e30,
    )
    return out, present_k, present_v


TRANSLATIONS = {
    torch.ops.edgeseq.cached_self_attention.default: _cached_self_attention_onnx,
    torch.ops.edgeseq.padded_attention.default: _padded_attention_onnx,
    torch.ops.edgeseq.masked_self_attention.default: _masked_self_attention_onnx,
    torch.ops.edgeseq.in_place_self_attention.default: _in_place_self_attention_onnx,
}
