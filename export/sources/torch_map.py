"""How a user's `torch.nn.Transformer` model maps onto `Seq2SeqTransformer`: its parts found
by the names of the mapping (export/sources/torch_module.py documents the contract), checked,
read into a ModelConfig and copied, rows renumbered to edgeseq's ids.

    parts = Parts.find(module, mapping)          # SourceError naming what does not map
    model = our_model(parts, src_vocab, tgt_vocab, mapping)    # eval mode, edgeseq ids

Embedding and positional modules are probed, not trusted by name: an embedding module must
return its one (V, D) table's rows times 1 or sqrt(d_model); a positional module must add the
same (L, D) table to any input (read off by calling it twice on random inputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from edgeseq.build_model.model import Seq2SeqTransformer, sinusoidal_halves_table, sinusoidal_table
from edgeseq.runtime.config import ModelConfig

from . import SourceError
from .renumber import Vocabulary

DEFAULT_MAX_LEN = 256  # positions of a model without a positional table ("none")
TABLE_MATCH = 1e-6  # a table this close to a formula is stored as the formula
DECODER_ATTN = ("self_attn", "multihead_attn")  # a decoder layer's attention modules


def _resolve(module: nn.Module, dotted: str, role: str) -> Any:
    """The attribute at `dotted` ("a.b.0.c") below `module`."""
    obj: Any = module
    for name in dotted.split("."):
        if isinstance(obj, (nn.ModuleList, nn.Sequential)) and name.isdigit():
            obj = obj[int(name)] if int(name) < len(obj) else None
        else:
            obj = getattr(obj, name, None)
        if obj is None:
            raise SourceError(f"{role} {dotted!r} is not an attribute of the module")
    return obj


# -- the parts of the user's model --------------------------------------------------------------
@dataclass
class _Embedding:
    """One side's vectors: the user's module, its (V, D) table, the scale applied outside it
    and the one applied in total (1 or sqrt(D))."""

    module: nn.Module
    table: Tensor
    outside: float
    total: float

    @classmethod
    def find(
        cls, module: nn.Module, role: str, name: str, d_model: int, scale: bool | None
    ) -> _Embedding:
        """The embedding `name` (the mapping's `role`), its table and scales, probed."""
        part = _resolve(module, name, role)
        table = part.weight if isinstance(part, nn.Embedding) else None
        if isinstance(part, nn.Embedding) and part.max_norm is not None:
            raise SourceError(f"{role} {name} has max_norm (renormalises rows): not a table")
        if table is None and isinstance(part, nn.Module):
            tensors = [*part.parameters(), *part.buffers()]
            table = tensors[0] if len(tensors) == 1 and tensors[0].dim() == 2 else None
        if table is None or table.shape[-1] != d_model:
            raise SourceError(f"{role} {name} does not hold one (vocabulary, {d_model}) table")
        ids = torch.arange(table.shape[0])[:, None]  # (V, 1): any layout's lookup
        with torch.no_grad():
            inside = _ratio(part(ids)[:, 0], table.detach(), d_model)
        if inside is None:
            raise SourceError(f"{role} {name} is not a lookup of its table times 1 or sqrt(D)")
        outside = math.sqrt(d_model) if scale and inside == 1.0 else 1.0
        if scale is False and inside != 1.0:
            raise SourceError(f"{role} {name} scales by sqrt(d_model) but scale_embedding is false")
        return cls(part, table, outside, inside * outside)

    def __call__(self, ids: Tensor) -> Tensor:
        """The vectors the user's forward feeds to the positions."""
        return self.module(ids) * self.outside if self.outside != 1.0 else self.module(ids)


def _ratio(got: Tensor, table: Tensor, d_model: int) -> float | None:
    """1.0 or sqrt(d_model) when got == table x that; None otherwise."""
    for scale in (1.0, math.sqrt(d_model)):
        if torch.allclose(got, table * scale, rtol=1e-6, atol=1e-7):
            return scale
    return None


@dataclass
class _Positional:
    """One side's positions: how the reference adds them and the (L, D) table they add."""

    kind: str  # "module" (calls it on x), "embedding" (adds module(arange)), "table", "none"
    part: Any
    table: Tensor | None  # (L, D); None for "none"

    @classmethod
    def find(cls, module: nn.Module, name: str, d_model: int, batch_first: bool) -> _Positional:
        """The positions `name` adds: a module (probed), an nn.Embedding, a tensor or none."""
        if name == "none":
            return cls("none", None, None)
        part = _resolve(module, name, "positional")
        if isinstance(part, Tensor):
            table = part.detach().reshape(-1, d_model) if part.shape[-1] == d_model else None
            if table is None or table.shape[0] != max(part.shape[:-1], default=1):
                raise SourceError(f"positional {name} is not an (L, {d_model}) table")
            return cls("table", table, table)
        if isinstance(part, nn.Embedding):
            return cls("embedding", part, part.weight.detach())
        if not isinstance(part, nn.Module):
            raise SourceError(f"positional {name} is neither a module nor a tensor")
        return cls("module", part, _probe_table(part, name, d_model, batch_first))

    def add(self, x: Tensor, batch_first: bool) -> Tensor:
        """x (B, T, D) or (T, B, D) plus positions 0..T-1."""
        if self.kind == "module":
            return self.part(x)
        if self.kind == "none":
            return x
        length = x.shape[1] if batch_first else x.shape[0]
        rows = self.part(torch.arange(length)) if self.kind == "embedding" else self.part[:length]
        return x + (rows[None] if batch_first else rows[:, None])


def _probe_table(part: nn.Module, name: str, d_model: int, batch_first: bool) -> Tensor:
    """The table a positional module adds, read by calling it on two inputs; refuse a module
    that does not add a fixed (L, D) table (rotary, scaled or learned-relative positions)."""
    tensors = [*part.named_parameters(), *part.named_buffers()]
    tables = [t for _, t in tensors if t.numel() % d_model == 0 and t.shape[-1] == d_model]
    if len(tensors) != 1 or len(tables) != 1:
        held = ", ".join(f"{n} {tuple(t.shape)}" for n, t in tensors) or "no tensor"
        raise SourceError(
            f"positional {name} must hold one (L, {d_model}) table; it holds {held} (rotary or "
            "relative positions do not map)"
        )
    length = tables[0].numel() // d_model
    shape = (2, length, d_model) if batch_first else (length, 2, d_model)
    generator = torch.Generator().manual_seed(0)
    added = []
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(shape, generator=generator)
            try:
                added.append(part(x) - x)
            except Exception as exc:  # the user's code: any error means it does not fit
                raise SourceError(f"positional {name} fails on (…, D) input: {exc}") from None
    first, second = (a if batch_first else a.transpose(0, 1) for a in added)  # (2, L, D)
    rows = (first[0], first[1], second[0])  # what was added to 3 inputs: one table if fixed
    if not all(torch.allclose(rows[0], r, atol=1e-5) for r in rows[1:]):
        raise SourceError(f"positional {name} does not add a fixed table to its input")
    return rows[0]


@dataclass
class Parts:
    """The user's modules that `Seq2SeqTransformer` and the reference are built from."""

    module: nn.Module
    transformer: nn.Transformer
    src_embed: _Embedding
    tgt_embed: _Embedding
    src_pos: _Positional
    tgt_pos: _Positional
    generator: nn.Linear
    batch_first: bool

    @classmethod
    def find(cls, module: nn.Module, mapping: dict[str, Any]) -> Parts:
        """The parts the mapping names, each checked for what it must be."""
        transformer = _resolve(module, mapping["transformer"], "transformer")
        if not isinstance(transformer, nn.Transformer):
            raise SourceError(
                f"transformer {mapping['transformer']} is {type(transformer).__name__}, "
                "not torch.nn.Transformer"
            )
        d_model, batch_first = transformer.d_model, transformer.batch_first
        scale = mapping.get("scale_embedding")
        src, tgt = (
            _Embedding.find(module, role, mapping[role], d_model, scale)
            for role in ("source_embedding", "target_embedding")
        )
        if src.total != tgt.total:
            raise SourceError("source and target embeddings differ in scale (sqrt(d_model))")
        positional = mapping.get("positional")
        names = [mapping.get(f"{side}_positional", positional) for side in ("source", "target")]
        if None in names:
            raise SourceError("torch mapping lacks positional (a module, a table or 'none')")
        src_pos, tgt_pos = (_Positional.find(module, n, d_model, batch_first) for n in names)
        generator = _resolve(module, mapping["generator"], "generator")
        if not isinstance(generator, nn.Linear):
            raise SourceError(f"generator {mapping['generator']} is not an nn.Linear")
        return cls(module, transformer, src, tgt, src_pos, tgt_pos, generator, batch_first)


# -- the weight map ------------------------------------------------------------------------------
def our_model(
    parts: Parts, src_vocab: Vocabulary, tgt_vocab: Vocabulary, mapping: dict[str, Any]
) -> Seq2SeqTransformer:
    """A Seq2SeqTransformer holding the user's weights, rows in edgeseq ids."""
    cfg = _config(parts, src_vocab, tgt_vocab, mapping)
    model = Seq2SeqTransformer(cfg)
    src_rows = torch.as_tensor(src_vocab.to_source)
    tgt_rows = torch.as_tensor(tgt_vocab.to_source)
    t, n = parts.transformer, cfg.max_len
    with torch.no_grad():
        model.src_embed.weight.copy_(parts.src_embed.table[src_rows])
        model.tgt_embed.weight.copy_(parts.tgt_embed.table[tgt_rows])
        if cfg.positional == "learned":
            for ours, theirs in ((model.src_pos, parts.src_pos), (model.tgt_pos, parts.tgt_pos)):
                ours.table.copy_(theirs.table[:n] if theirs.table is not None else 0.0)
        for ours, theirs in zip(model.encoder_layers, t.encoder.layers, strict=True):
            _copy_attention(ours.self_attn, theirs.self_attn)
            _copy_ffn(ours, theirs)
            _copy_norm(ours.sub_attn.norm, theirs.norm1)
            _copy_norm(ours.sub_ffn.norm, theirs.norm2)
        for ours, theirs in zip(model.decoder_layers, t.decoder.layers, strict=True):
            _copy_attention(ours.self_attn, theirs.self_attn)
            _copy_attention(ours.cross_attn, theirs.multihead_attn)
            _copy_ffn(ours, theirs)
            _copy_norm(ours.sub_self.norm, theirs.norm1)
            _copy_norm(ours.sub_cross.norm, theirs.norm2)
            _copy_norm(ours.sub_ffn.norm, theirs.norm3)
        if cfg.has_final_norm:
            _copy_norm(model.encoder_norm, t.encoder.norm)
            _copy_norm(model.decoder_norm, t.decoder.norm)
        if not cfg.tie_output:
            model.output.weight.copy_(parts.generator.weight[tgt_rows])
        if model.output.bias is not None:
            model.output.bias.copy_(parts.generator.bias[tgt_rows])
    return model.eval()


def _config(
    parts: Parts, src_vocab: Vocabulary, tgt_vocab: Vocabulary, mapping: dict[str, Any]
) -> ModelConfig:
    """The ModelConfig of the user's model; refuses what does not map."""
    t, d_model = parts.transformer, parts.transformer.d_model
    for side, vocab, embed in (
        ("source", src_vocab, parts.src_embed),
        ("target", tgt_vocab, parts.tgt_embed),
    ):
        if vocab.size != embed.table.shape[0]:
            raise SourceError(
                f"{side}_vocab has {vocab.size} tokens but the {side} embedding has "
                f"{embed.table.shape[0]} rows"
            )
    if parts.generator.out_features != tgt_vocab.size or parts.generator.in_features != d_model:
        raise SourceError(
            f"generator maps {parts.generator.in_features} -> {parts.generator.out_features}, "
            f"not d_model {d_model} -> the target vocabulary's {tgt_vocab.size}"
        )
    activation, norm_first, eps, final = _check_stacks(t)
    norm = "pre" if norm_first else "post"
    tables = [p.table for p in (parts.src_pos, parts.tgt_pos) if p.table is not None]
    max_len = min([len(table) for table in tables] or [DEFAULT_MAX_LEN])
    max_len = min(max_len, int(mapping.get("max_len") or max_len))
    tie = parts.generator.weight is parts.tgt_embed.table  # one Parameter: tied
    bias = parts.generator.bias is not None
    return ModelConfig(
        src_vocab_size=src_vocab.size,
        tgt_vocab_size=tgt_vocab.size,
        d_model=d_model,
        n_heads=t.nhead,
        n_encoder_layers=len(t.encoder.layers),
        n_decoder_layers=len(t.decoder.layers),
        d_ff=t.encoder.layers[0].linear1.out_features,
        dropout=0.0,
        max_len=max_len,
        positional=_positional_kind(tables, max_len, d_model),
        norm=norm,
        activation=activation,
        tie_output=tie,
        layer_norm_eps=eps,
        scale_embedding=parts.src_embed.total != 1.0,
        final_norm=None if final == (norm == "pre") else final,
        output_bias=None if bias == (not tie) else bias,
    ).validate()


def _check_stacks(t: nn.Transformer) -> tuple[str, bool, float, bool]:
    """The activation, norm_first, LayerNorm eps and final norms shared by every layer of
    both stacks; refuses layers, attention, norms or activations that do not map."""
    stacks = (("encoder", nn.TransformerEncoder, nn.TransformerEncoderLayer, 2, ("self_attn",)),)
    stacks += (("decoder", nn.TransformerDecoder, nn.TransformerDecoderLayer, 3, DECODER_ATTN),)
    activations, norm_first, eps, finals = set(), set(), set(), set()
    for side, stack_type, layer_type, n_norms, attentions in stacks:
        stack = getattr(t, side)
        if not isinstance(stack, stack_type):
            raise SourceError(
                f"transformer.{side} is {type(stack).__name__}, not {stack_type.__name__}"
            )
        norms = [stack.norm] if stack.norm is not None else []
        finals.add(stack.norm is not None)
        for i, layer in enumerate(stack.layers):
            name = f"{side}.layers.{i}"
            if not isinstance(layer, layer_type):
                raise SourceError(f"{name} is {type(layer).__name__}, not {layer_type.__name__}")
            for attn in attentions:
                _check_attention(getattr(layer, attn), f"{name}.{attn}", t.nhead)
            activations.add(_activation(layer, name))
            norm_first.add(layer.norm_first)
            norms += [getattr(layer, f"norm{k}") for k in range(1, n_norms + 1)]
        for norm in norms:
            if not isinstance(norm, nn.LayerNorm):
                raise SourceError(f"a {side} norm is {type(norm).__name__}, not nn.LayerNorm")
            eps.add(norm.eps)
    for what, values in (("activation", activations), ("norm_first", norm_first), ("eps", eps)):
        if len(values) > 1:
            raise SourceError(f"layers differ in {what} ({sorted(map(str, values))})")
    if len(finals) > 1:
        raise SourceError("one of encoder.norm and decoder.norm is None: both or neither")
    return activations.pop(), norm_first.pop(), float(eps.pop()), finals.pop()


def _check_attention(attn: Any, name: str, n_heads: int) -> None:
    """Refuse an attention module that does not map onto MultiHeadAttention."""
    if not isinstance(attn, nn.MultiheadAttention):
        raise SourceError(f"{name} is {type(attn).__name__}, not torch.nn.MultiheadAttention")
    if attn.bias_k is not None or attn.add_zero_attn:
        raise SourceError(f"{name} uses add_bias_kv or add_zero_attn: not mapped")
    if attn.kdim != attn.embed_dim or attn.vdim != attn.embed_dim or attn.num_heads != n_heads:
        raise SourceError(f"{name} has kdim/vdim or heads other than the transformer's")


def _activation(layer: nn.Module, name: str) -> str:
    """ "relu", "gelu" or "silu" of a layer's activation (a function or a module)."""
    act = getattr(layer, "activation", None)
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    if act is F.silu or isinstance(act, nn.SiLU):
        return "silu"
    raise SourceError(f"{name}.activation {act!r} is not relu, exact gelu or silu")


def _positional_kind(tables: list[Tensor], max_len: int, d_model: int) -> str:
    """A formula's name when both sides add that formula's table, else "learned"."""
    if len(tables) == 2:
        for kind, formula in (
            ("sinusoidal", sinusoidal_table),
            ("sinusoidal-halves", sinusoidal_halves_table),
        ):
            want = formula(max_len, d_model)
            if all(torch.allclose(t[:max_len], want, atol=TABLE_MATCH, rtol=0) for t in tables):
                return kind
    return "learned"


def _copy_attention(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    d = theirs.embed_dim
    if theirs.in_proj_weight is not None:
        weights = theirs.in_proj_weight.split(d)
    else:
        weights = (theirs.q_proj_weight, theirs.k_proj_weight, theirs.v_proj_weight)
    biases = theirs.in_proj_bias.split(d) if theirs.in_proj_bias is not None else (None,) * 3
    for linear, w, b in zip((ours.w_q, ours.w_k, ours.w_v), weights, biases, strict=True):
        _copy_linear(linear, w, b)
    _copy_linear(ours.w_o, theirs.out_proj.weight, theirs.out_proj.bias)


def _copy_ffn(ours: nn.Module, theirs: nn.Module) -> None:
    _copy_linear(ours.ffn.w_1, theirs.linear1.weight, theirs.linear1.bias)
    _copy_linear(ours.ffn.w_2, theirs.linear2.weight, theirs.linear2.bias)


def _copy_linear(ours: nn.Linear, weight: Tensor, bias: Tensor | None) -> None:
    """Copy a weight and bias (None: zero, which is what bias=False computes)."""
    ours.weight.copy_(weight)
    ours.bias.copy_(bias if bias is not None else torch.zeros_like(ours.bias))


def _copy_norm(ours: nn.LayerNorm, theirs: nn.LayerNorm) -> None:
    """Copy a LayerNorm; no affine weight is ones, no bias zeros (the same arithmetic)."""
    ours.weight.copy_(theirs.weight if theirs.weight is not None else 1.0)
    ours.bias.copy_(theirs.bias if theirs.bias is not None else 0.0)
