"""Convert an edgeseq `Seq2SeqTransformer` to a CTranslate2 `TransformerSpec` model directory.

    from ct2_convert import convert_to_ctranslate2, ct2_vocabulary
    convert_to_ctranslate2(model, "runs/ct2-g2p")              # float32 weights
    translator = ctranslate2.Translator("runs/ct2-g2p", compute_type="int8")

Benchmark-only (`pip install 'edgeseq[bench]'`): `benchmarks/vs_ctranslate2.py` uses it to
put CTranslate2 next to edgeseq on the same weights. The mapping, layer by layer:

- token embeddings as they are, with `scale_embeddings` (CTranslate2 multiplies by
  sqrt(d_model), as `TokenEmbedding` does);
- the positional table given explicitly (`position_encodings.encodings`, max_len rows):
  CTranslate2's built-in sinusoids concatenate sin and cos, ours interleave them;
- self-attention: W_Q, W_K, W_V fused into one (3D, D) linear, then W_O; cross-attention:
  W_Q, then W_K and W_V fused into one (2D, D) linear, then W_O;
- `pre_norm` from the config: post-norm puts each sublayer's LayerNorm after the residual
  sum, pre-norm before it, with a final LayerNorm on each stack;
- the output projection (the target embedding when `tie_output`, with a zero bias).

CTranslate2 works on token strings, so the vocabularies are synthetic: id i is the token
`ct2_vocabulary(size)[i]`, and the special tokens are the names of the config's special ids.
"""

from __future__ import annotations

from pathlib import Path

import ctranslate2
import numpy as np
import torch
from ctranslate2.converters.converter import Converter
from ctranslate2.specs import common_spec
from ctranslate2.specs.transformer_spec import TransformerSpec

from edgeseq.build_model.model import MultiHeadAttention, Seq2SeqTransformer, Sublayer


def ct2_vocabulary(size: int) -> list[str]:
    """Token strings of ids 0..size-1 (CTranslate2 looks tokens up by string)."""
    return [f"<{i}>" for i in range(size)]


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy().copy()


def _linear(spec: common_spec.LinearSpec, *layers: torch.nn.Linear) -> None:
    """`spec` = the layers stacked along the output axis: weight (sum out, in), bias."""
    spec.weight = np.concatenate([_array(layer.weight) for layer in layers])
    spec.bias = np.concatenate([_array(layer.bias) for layer in layers])


def _norm(spec: common_spec.LayerNormSpec, sublayer: Sublayer | torch.nn.LayerNorm) -> None:
    norm = sublayer.norm if isinstance(sublayer, Sublayer) else sublayer
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _self_attention(spec, attention: MultiHeadAttention, sublayer: Sublayer) -> None:
    _linear(spec.linear[0], attention.w_q, attention.w_k, attention.w_v)
    _linear(spec.linear[1], attention.w_o)
    _norm(spec.layer_norm, sublayer)


def _ffn(spec, layer) -> None:
    _linear(spec.linear_0, layer.ffn.w_1)
    _linear(spec.linear_1, layer.ffn.w_2)
    _norm(spec.layer_norm, layer.sub_ffn)


def transformer_spec(model: Seq2SeqTransformer) -> TransformerSpec:
    """The CTranslate2 spec of `model`, weights filled in (see the module docstring)."""
    cfg = model.cfg
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    spec = TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm == "pre",
        activation=activation[cfg.activation],
    )
    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = _array(model.src_embed.weight)
    decoder.embeddings.weight = _array(model.tgt_embed.weight)
    encoder.scale_embeddings = decoder.scale_embeddings = True
    encoder.position_encodings.encodings = _array(model.src_pos.table)
    decoder.position_encodings.encodings = _array(model.tgt_pos.table)
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.sub_attn)
        _ffn(layer_spec.ffn, layer)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.sub_self)
        cross = layer_spec.attention
        _linear(cross.linear[0], layer.cross_attn.w_q)
        _linear(cross.linear[1], layer.cross_attn.w_k, layer.cross_attn.w_v)
        _linear(cross.linear[2], layer.cross_attn.w_o)
        _norm(cross.layer_norm, layer.sub_cross)
        _ffn(layer_spec.ffn, layer)
    if model.encoder_norm is not None:
        _norm(encoder.layer_norm, model.encoder_norm)
        _norm(decoder.layer_norm, model.decoder_norm)
    decoder.projection.weight = _array(model.output.weight)
    bias = model.output.bias
    decoder.projection.bias = (
        _array(bias) if bias is not None else np.zeros(cfg.tgt_vocab_size, np.float32)
    )
    src_vocab, tgt_vocab = ct2_vocabulary(cfg.src_vocab_size), ct2_vocabulary(cfg.tgt_vocab_size)
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    config = spec.config
    config.unk_token, config.bos_token = tgt_vocab[cfg.unk_id], tgt_vocab[cfg.bos_id]
    config.eos_token, config.decoder_start_token = tgt_vocab[cfg.eos_id], tgt_vocab[cfg.bos_id]
    config.layer_norm_epsilon = cfg.layer_norm_eps
    return spec


class EdgeseqConverter(Converter):
    """CTranslate2's converter recipe (validate, optimize, save) around `transformer_spec`."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        self.model = model

    def _load(self) -> TransformerSpec:
        return transformer_spec(self.model)


def convert_to_ctranslate2(
    model: Seq2SeqTransformer, out: str | Path, quantization: str | None = None
) -> Path:
    """Write `model` as a CTranslate2 model directory at `out` (replaced if present), with
    weights stored in `quantization` (None: float32; a Translator's `compute_type` can still
    quantize at load time). Returns `out`."""
    EdgeseqConverter(model).convert(str(out), quantization=quantization, force=True)
    return Path(out)


def ct2_version() -> str:
    """The installed CTranslate2 version."""
    return ctranslate2.__version__
