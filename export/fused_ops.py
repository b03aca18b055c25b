"""Three attention operators that export as onnxruntime's `com.microsoft` `MultiHeadAttention`.

    out, present_k, present_v = cached_self_attention(q, k, v, past_k, past_v, n_heads)
    out = padded_attention(q, k, v, keep, n_heads)
    out, present_k, present_v = masked_self_attention(q, k, v, past_k, past_v, keep, n_heads)

Each is a `torch.library` custom op: in PyTorch it runs a reference implementation (the same
arithmetic as `build_model.model.MultiHeadAttention.attend`), and `TRANSLATIONS` maps it to
one `MultiHeadAttention` node for `torch.onnx.export(custom_translation_table=...)`. The node
does the head split and merge, the scaling, the masking, the softmax, both products and
(self-attention) the cache concatenation, which the plain export spells as a dozen nodes.
Shapes: B batch, N new tokens, P cached tokens, S keys, H heads, dh head size, D = H * dh.
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


def _split(x: Tensor, n_heads: int) -> Tensor:
    """(B, T, D) -> (B, H, T, dh)."""
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).transpose(1, 2)


def _attend(q: Tensor, k: Tensor, v: Tensor, keep: Tensor) -> Tensor:
    """q (B, H, T, dh), k/v (B, H, S, dh), keep broadcastable to (B, H, T, S) -> (B, T, D)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
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
    keys = torch.cat([past_k, _split(k, n_heads)], dim=2)
    values = torch.cat([past_v, _split(v, n_heads)], dim=2)
    past, new = past_k.shape[2], q.shape[1]
    q_pos = torch.arange(new, device=q.device) + past
    keep = torch.arange(past + new, device=q.device)[None, :] <= q_pos[:, None]  # (N, P+N)
    return _attend(_split(q, n_heads), keys, values, keep), keys, values


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
    keys = torch.cat([past_k, _split(k, n_heads)], dim=2)
    values = torch.cat([past_v, _split(v, n_heads)], dim=2)
    past, new = past_k.shape[2], q.shape[1]
    q_pos = torch.arange(new, device=q.device) + past
    causal = torch.arange(past + new, device=q.device)[None, :] <= q_pos[:, None]  # (N, P+N)
    mask = causal[None, None] & keep.bool()[:, None, None, :]  # (B, 1, N, P+N)
    return _attend(_split(q, n_heads), keys, values, mask), keys, values


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
        k, v = _split(k, n_heads), _split(v, n_heads)
    return _attend(_split(q, n_heads), k, v, keep.bool()[:, None, None, :])


@padded_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, n_heads: int):
    return q.new_empty(q.shape)


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


TRANSLATIONS = {
    torch.ops.edgeseq.cached_self_attention.default: _cached_self_attention_onnx,
    torch.ops.edgeseq.padded_attention.default: _padded_attention_onnx,
    torch.ops.edgeseq.masked_self_attention.default: _masked_self_attention_onnx,
}
