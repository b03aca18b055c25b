"""The fused attention operators of export/fused_ops.py with a score bias: T5's relative
position bias (build_model/relative.py), computed once per graph call and fed to every
self-attention node of a stack.

    out = biased_padded_attention(q, k, v, keep, bias, n_heads)            # encoder
    out, present_k, present_v = biased_cached_self_attention(q, k, v, past_k, past_v, bias,
                                                             n_heads)      # decoder.onnx
    out, present_k, present_v = biased_masked_self_attention(q, k, v, past_k, past_v, keep,
                                                             bias, n_heads)  # steps decoder
    out, cache_k, cache_v = biased_in_place_self_attention(q, k, v, keep, bias, cache_k,
        cache_v, past_len, beam_width, indirection, n_heads)               # in-place decoder

Each is its unbiased twin plus `bias`, added to Q Kᵀ / sqrt(dh) before the mask and the
softmax. In ONNX the bias is the `attention_bias` input of `MultiHeadAttention` (shape
(1, H, N, P+N) here; onnxruntime takes (B or 1, H or 1, N, total)) and of
`DecoderMaskedMultiHeadAttention` ((1, H, 1, P+1): one new token, P+1 the positions filled,
not the buffer's length M, which onnxruntime 1.31 refuses). Shapes as in fused_ops.py.
"""

from __future__ import annotations

import onnxscript
import torch
from onnxscript import FLOAT, INT32
from onnxscript import opset18 as op
from torch import Tensor

from .fused_ops import MS, attend_heads, cached_reference, in_place_reference, split_heads


@torch.library.custom_op("edgeseq::biased_padded_attention", mutates_args=())
def biased_padded_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, bias: Tensor, n_heads: int
) -> Tensor:
    """`padded_attention` with a score bias: q/k/v (B, S, D) projected, keep (B, S) int32,
    bias (1, H, S, S) -> out (B, S, D) before the output projection."""
    mask = keep.bool()[:, None, None, :]
    return attend_heads(
        split_heads(q, n_heads), split_heads(k, n_heads), split_heads(v, n_heads), mask, bias
    )


@biased_padded_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, bias: Tensor, n_heads: int):
    return q.new_empty(q.shape)


@torch.library.custom_op("edgeseq::biased_cached_self_attention", mutates_args=())
def biased_cached_self_attention(
    q: Tensor, k: Tensor, v: Tensor, past_k: Tensor, past_v: Tensor, bias: Tensor, n_heads: int
) -> tuple[Tensor, Tensor, Tensor]:
    """`cached_self_attention` with a score bias (1, H, N, P+N)."""
    return cached_reference(q, k, v, past_k, past_v, None, bias, n_heads)


@biased_cached_self_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, past_k: Tensor, past_v: Tensor, bias: Tensor, n_heads: int):
    b, h, p, dh = past_k.shape
    total = p + q.shape[1]
    return q.new_empty(q.shape), q.new_empty((b, h, total, dh)), q.new_empty((b, h, total, dh))


@torch.library.custom_op("edgeseq::biased_masked_self_attention", mutates_args=())
def biased_masked_self_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    past_k: Tensor,
    past_v: Tensor,
    keep: Tensor,
    bias: Tensor,
    n_heads: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """`masked_self_attention` (keep (B, P+N) int32) with a score bias (1, H, N, P+N)."""
    return cached_reference(q, k, v, past_k, past_v, keep, bias, n_heads)


@biased_masked_self_attention.register_fake
def _(q, k, v, past_k, past_v, keep, bias, n_heads):
    b, h, p, dh = past_k.shape
    total = p + q.shape[1]
    return q.new_empty(q.shape), q.new_empty((b, h, total, dh)), q.new_empty((b, h, total, dh))


@torch.library.custom_op("edgeseq::biased_in_place_self_attention", mutates_args=())
def biased_in_place_self_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor,
    bias: Tensor,
    cache_k: Tensor,
    cache_v: Tensor,
    past_len: Tensor,
    beam_width: Tensor,
    indirection: Tensor,
    n_heads: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """`in_place_self_attention` with a score bias (1, H, 1, P+1)."""
    return in_place_reference(
        q, k, v, keep, bias, cache_k, cache_v, past_len, beam_width, indirection, n_heads
    )


@biased_in_place_self_attention.register_fake
def _(q, k, v, keep, bias, cache_k, cache_v, past_len, beam_width, indirection, n_heads):
    return q.new_empty(q.shape), cache_k.new_empty(cache_k.shape), cache_v.new_empty(cache_v.shape)


@onnxscript.script(MS, default_opset=op)
def _biased_padded_attention_onnx(
    q: FLOAT, k: FLOAT, v: FLOAT, keep: INT32, bias: FLOAT, n_heads: int
) -> FLOAT:
    """One MultiHeadAttention node: key padding mask and attention_bias."""
    out = MS.MultiHeadAttention(
        q, k, v, None, keep, bias, num_heads=n_heads, mask_filter_value=-1e30
    )
    return out


@onnxscript.script(MS, default_opset=op)
def _biased_cached_self_attention_onnx(
    q: FLOAT, k: FLOAT, v: FLOAT, past_k: FLOAT, past_v: FLOAT, bias: FLOAT, n_heads: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """One causal MultiHeadAttention node with the cache and attention_bias."""
    out, present_k, present_v = MS.MultiHeadAttention(
        q, k, v, None, None, bias, past_k, past_v,
        num_heads=n_heads, unidirectional=1, mask_filter_value=-1e30,
    )  # fmt: skip
    return out, present_k, present_v


@onnxscript.script(MS, default_opset=op)
def _biased_masked_self_attention_onnx(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    past_k: FLOAT,
    past_v: FLOAT,
    keep: INT32,
    bias: FLOAT,
    n_heads: int,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """One causal MultiHeadAttention node with the cache, a key mask of past + new length
    and attention_bias."""
    out, present_k, present_v = MS.MultiHeadAttention(
        q, k, v, None, keep, bias, past_k, past_v,
        num_heads=n_heads, unidirectional=1, mask_filter_value=-1e30,
    )  # fmt: skip
    return out, present_k, present_v


@onnxscript.script(MS, default_opset=op)
def _biased_in_place_self_attention_onnx(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    keep: INT32,
    bias: FLOAT,
    cache_k: FLOAT,
    cache_v: FLOAT,
    past_len: INT32,
    beam_width: INT32,
    indirection: INT32,
    n_heads: int,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """One DecoderMaskedMultiHeadAttention node (shared past/present buffer) with
    attention_bias."""
    out, present_k, present_v = MS.DecoderMaskedMultiHeadAttention(
        q, k, v, keep, bias, cache_k, cache_v, past_len, beam_width, indirection,
        num_heads=n_heads, past_present_share_buffer=1, mask_filter_value=-1e30,
    )  # fmt: skip
    return out, present_k, present_v


TRANSLATIONS = {
    torch.ops.edgeseq.biased_padded_attention.default: _biased_padded_attention_onnx,
    torch.ops.edgeseq.biased_cached_self_attention.default: _biased_cached_self_attention_onnx,
    torch.ops.edgeseq.biased_masked_self_attention.default: _biased_masked_self_attention_onnx,
    torch.ops.edgeseq.biased_in_place_self_attention.default: (
        _biased_in_place_self_attention_onnx
    ),
}
