"""The Marian adapter: a Hugging Face MarianMT checkpoint directory (`save_pretrained`'s
layout: config.json with model_type marian, model.safetensors or pytorch_model.bin, vocab.json,
source.spm/target.spm, tokenizer_config.json), mapped onto `Seq2SeqTransformer`.

    source = load(Path("opus-mt-en-de"))      # SourceModel; reference wraps MarianMTModel

The map (PITFALLS.md, "Importing Hugging Face MarianMT"): post-norm layers, SiLU for
`swish`, token embeddings x sqrt(d_model) when scale_embedding, Marian's [sin half | cos half]
positions from 0 (computed, not stored: positional "sinusoidal-halves"), no embedding or final
layernorm, the output tied to the target embedding plus final_logits_bias (output_bias),
max_position_embeddings -> max_len, shared or separate vocabularies.

Ids are renumbered as marian_tokenizer.py does: edgeseq 0 `<pad>` (Marian's pad, its last id),
1 `<s>` (a new row, a copy of pad's: Marian starts decoding from pad), 2 `</s>` (Marian 0),
3 `<unk>` (Marian 1), Marian m >= 2 -> m + 2; the vocabulary grows by one.

Marian's generate bans `<pad>` (generation_config.bad_words_ids); edgeseq's search bans
nothing, so the logits of `<pad>` and `<s>` are made exactly SUPPRESSED (-1e4, finite so that
parity differences stay finite): their output rows are zero (tied: the pad row, zero in every
OPUS-MT model; a tied model whose pad row is not zero gets an untied copy) and their bias is
SUPPRESSED. Neither is ever generated. The reference sets the same two columns to SUPPRESSED
(Marian's own generate bans them), so they compare exactly: adding -1e4 to logits instead
would differ by float32's rounding at 1e4 (~1e-3) wherever the pad row is not zero.

`reference.generate` runs MarianMTModel.generate as edgeseq's search runs: do_sample False,
length_penalty 1.0, early_stopping True (edgeseq's beam search stops an input at beam_size
finished hypotheses; Marian's default keeps searching while a live beam could still win, and
returned a longer hypothesis on a random model), forced_eos_token_id off (Marian forces `</s>`
at the length cap where edgeseq stops without it: at the cap both return max_new_tokens
tokens). `bad_words_ids` stays: it bans `<pad>` as SUPPRESSED does.

Refused with one line naming the field or file: another model_type, mBART-style options
(normalize_before, add_final_layer_norm, normalize_embedding), an activation other than
swish/silu, relu or gelu, encoder and decoder of different heads or FFN widths, a decoder
start other than pad, missing weights, a pytorch_model.bin that torch.load(weights_only=True)
cannot read, vocabulary sizes that differ between config.json, the vocabularies and the
weights, weights the map does not consume (the first unexpected key).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from edgeseq.build_model.model import Seq2SeqTransformer, sinusoidal_halves_table
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import TokenizerError
from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

from . import SourceError, SourceModel
from .generation_config import parity_generate_kwargs, read_generation
from .hf_checkpoint import (
    check_stacks,
    config_model_type,
    read_typed_config,
    read_weights,
    stack_fields,
    weights_file,
)

NAME = "marian"
SUPPRESSED = -1e4  # the logit of <pad> and <s> (see the module docstring)
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
MBART_OPTIONS = ("normalize_before", "add_final_layer_norm", "normalize_embedding")
POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
# MarianConfig's defaults, for keys a config.json leaves out.
MARIAN_DEFAULTS = {"activation_function": "gelu", "scale_embedding": False}
MARIAN_DEFAULTS |= {"tie_word_embeddings": True, "share_encoder_decoder_embeddings": True}
# Our parameter -> Marian's, per layer (a weight and a bias each).
ATTENTION = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
FFN = {"ffn.w_1": "fc1", "ffn.w_2": "fc2", "sub_ffn.norm": "final_layer_norm"}
ENCODER_MAP = {f"self_attn.{ours}": f"self_attn.{m}" for ours, m in ATTENTION.items()}
ENCODER_MAP |= {"sub_attn.norm": "self_attn_layer_norm", **FFN}
DECODER_MAP = {f"self_attn.{ours}": f"self_attn.{m}" for ours, m in ATTENTION.items()}
DECODER_MAP |= {f"cross_attn.{ours}": f"encoder_attn.{m}" for ours, m in ATTENTION.items()}
DECODER_MAP |= {"sub_self.norm": "self_attn_layer_norm", **FFN}
DECODER_MAP |= {"sub_cross.norm": "encoder_attn_layer_norm"}


def detect(path: Path) -> bool:
    """A directory whose config.json says model_type marian."""
    return config_model_type(path) == NAME


def load(path: Path, **options: Any) -> SourceModel:
    """The checkpoint as a Seq2SeqTransformer (eval, CPU), its tokenizers in edgeseq ids and a
    reference wrapping MarianMTModel (loaded when first used)."""
    from .marian_tokenizer import marian_tokenizers, to_edgeseq_ids

    path = Path(path)
    config = read_config(path)
    src_pad, tgt_pad = _vocabulary_pads(path, config)
    state = read_weights(path)
    model = marian_model(config, state)
    source, target = marian_tokenizers(path)
    source_tok = Tokenizer(source, "unigram")
    target_tok = source_tok if target is source else Tokenizer(target, "unigram")
    reference = MarianReference(path, src_pad, tgt_pad)
    description = f"Hugging Face MarianMT checkpoint {path}"
    tokenizers = TokenizerPair(source_tok, target_tok)
    weights = (weights_file(path),)
    generation = read_generation(path, lambda m: int(to_edgeseq_ids([m], tgt_pad)[0]), 0, (0, 1))
    return SourceModel(
        model, tokenizers, None, NAME, description, reference, weights, generation=generation
    )


# -- config.json, the vocabularies and the weights --------------------------------------------
def read_config(path: Path) -> dict[str, Any]:
    """config.json, refused unless it describes a Marian model this map reproduces."""
    config = MARIAN_DEFAULTS | read_typed_config(path, (NAME,), NAME)
    for option in MBART_OPTIONS:
        if config.get(option):
            raise SourceError(f"config.json {option} is true (mBART-style): not mapped")
    check_stacks(config, ACTIVATIONS)
    pad = config.get("pad_token_id")
    if config.get("decoder_start_token_id", pad) != pad:
        start = config["decoder_start_token_id"]
        raise SourceError(f"config.json decoder_start_token_id {start} is not the pad id {pad}")
    return config


def _vocab_sizes(config: dict[str, Any]) -> tuple[int, int]:
    shared = config["share_encoder_decoder_embeddings"]
    size = config["vocab_size"]
    return size, size if shared else config.get("decoder_vocab_size") or size


def _vocabulary_pads(path: Path, config: dict[str, Any]) -> tuple[int, int]:
    """Marian's pad ids of the source and target vocabularies, checked against config.json."""
    from .marian_tokenizer import TARGET_VOCAB, TOKENIZER_CONFIG, VOCAB, check_vocab, read_vocab

    tok_config_path = path / TOKENIZER_CONFIG
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.is_file() else {}
    separate = bool(tok_config.get("separate_vocabs"))
    pads = []
    for name, size in zip(
        (VOCAB, TARGET_VOCAB if separate else VOCAB), _vocab_sizes(config), strict=True
    ):
        try:
            vocab = read_vocab(path / name)
            pads.append(check_vocab(vocab))
        except TokenizerError as exc:
            raise SourceError(f"{path / name}: {exc}") from None
        if len(vocab) != size:
            raise SourceError(f"{name} has {len(vocab)} entries but config.json says {size}")
        if pads[-1] != config.get("pad_token_id"):
            raise SourceError(f"{name}'s <pad> is {pads[-1]}, config.json's pad_token_id not")
    return pads[0], pads[1]


# -- the weight map --------------------------------------------------------------------------
def model_config(config: dict[str, Any], tie_output: bool) -> ModelConfig:
    """Our ModelConfig of a (checked) Marian config.json."""
    src_size, tgt_size = _vocab_sizes(config)
    return ModelConfig(
        src_vocab_size=src_size + 1,
        tgt_vocab_size=tgt_size + 1,
        **stack_fields(config),
        positional="sinusoidal-halves",
        norm="post",
        activation=ACTIVATIONS[config["activation_function"]],
        tie_output=tie_output,
        scale_embedding=bool(config["scale_embedding"]),
        output_bias=True,
    ).validate()


def marian_model(config: dict[str, Any], state: dict[str, Tensor]) -> Seq2SeqTransformer:
    """A Seq2SeqTransformer holding the Marian weights `state`, rows in edgeseq ids."""
    weights = _MarianWeights(state, config)
    source, target = _vocab_sizes(config)
    tgt_table = weights.embedding("target", target)
    tied = bool(config["tie_word_embeddings"])
    cfg = model_config(config, tie_output=tied and not tgt_table[target - 1].any())  # pad row 0
    model = Seq2SeqTransformer(cfg)
    params = dict(model.named_parameters())
    src_rows, tgt_rows = _rows(cfg.src_vocab_size), _rows(cfg.tgt_vocab_size)
    with torch.no_grad():
        params["src_embed.weight"].copy_(weights.embedding("source", source)[src_rows])
        params["tgt_embed.weight"].copy_(tgt_table[tgt_rows])
        for side, layers, mapping in (
            ("encoder", cfg.n_encoder_layers, ENCODER_MAP),
            ("decoder", cfg.n_decoder_layers, DECODER_MAP),
        ):
            for i in range(layers):
                for ours, theirs in mapping.items():
                    for kind in ("weight", "bias"):
                        marian = weights.take(f"model.{side}.layers.{i}.{theirs}.{kind}")
                        params[f"{side}_layers.{i}.{ours}.{kind}"].copy_(marian)
        if not cfg.tie_output:
            output = tgt_table if tied else weights.take("lm_head.weight")
            params["output.weight"].copy_(output[tgt_rows])
            params["output.weight"][:2] = 0.0
        params["output.bias"].copy_(weights.final_logits_bias(target)[tgt_rows])
        params["output.bias"][:2] = SUPPRESSED  # <pad>, <s>: never generated
    weights.check_positions(cfg)
    weights.check_all_used(tied)
    return model.eval()


class _MarianWeights:
    """A Marian state_dict, read by name; remembers which keys the map used."""

    def __init__(self, state: dict[str, Tensor], config: dict[str, Any]) -> None:
        self.state, self.used = state, set()
        self.shared = bool(config["share_encoder_decoder_embeddings"])
        # Older checkpoints store a shared table under every alias; newer ones under shared.
        names = ("model.shared.weight", "model.encoder.embed_tokens.weight")
        self.source_key = next((k for k in names if k in state), names[0])
        if not self.shared:
            self.source_key = "model.encoder.embed_tokens.weight"
        self.target_key = self.source_key if self.shared else "model.decoder.embed_tokens.weight"

    def take(self, key: str) -> Tensor:
        """The tensor `key`, marked used; SourceError when the weights lack it."""
        if key not in self.state:
            raise SourceError(f"the weights lack {key}")
        self.used.add(key)
        return self.state[key]

    def embedding(self, side: str, rows: int) -> Tensor:
        """The encoder's or decoder's token table (rows, D)."""
        key = self.source_key if side == "source" else self.target_key
        table = self.take(key)
        if table.shape[0] != rows:
            raise SourceError(f"{key} has {table.shape[0]} rows but config.json says {rows}")
        return table

    def final_logits_bias(self, size: int) -> Tensor:
        """final_logits_bias (V,); zeros when absent (transformers allows that)."""
        if "final_logits_bias" not in self.state:
            return torch.zeros(size)
        return self.take("final_logits_bias").reshape(-1)

    def check_positions(self, cfg: ModelConfig) -> None:
        """Stored positional tables (transformers leaves them out) must be Marian's formula."""
        want = sinusoidal_halves_table(cfg.max_len, cfg.d_model)
        for key in POSITION_KEYS:
            if key in self.state:
                table = self.take(key)[: cfg.max_len].float()
                if not torch.allclose(table, want, atol=1e-6):
                    raise SourceError(f"the weights' {key} is not Marian's sinusoidal table")

    def check_all_used(self, tied: bool) -> None:
        """Refuse weights the map did not use, except copies of a table it used (aliases of
        a shared or tied table), which must equal it."""
        aliases = {"lm_head.weight": self.target_key} if tied else {}
        if self.shared:
            for key in ("model.shared.weight", "model.encoder.embed_tokens.weight"):
                aliases[key] = self.source_key
            aliases["model.decoder.embed_tokens.weight"] = self.source_key
        for key in sorted(set(self.state) - self.used):
            if key not in aliases:
                raise SourceError(f"the weights hold {key}, which the Marian map does not use")
            if not torch.equal(self.state[key], self.state[aliases[key]]):
                raise SourceError(f"the weights' {key} differs from {aliases[key]} it is tied to")


def _rows(size: int) -> Tensor:
    """Marian's row of each edgeseq id 0..size-1 (pad twice: `<pad>` and `<s>`)."""
    pad = size - 2  # Marian's pad: its last id
    ids = torch.arange(size)
    return torch.where(ids <= 1, pad, ids - 2)


# -- the reference ---------------------------------------------------------------------------
class MarianReference:
    """`SourceReference` over transformers' MarianMTModel, in edgeseq ids (loaded when first
    used: transformers is needed for parity only)."""

    def __init__(self, path: Path, src_pad: int, tgt_pad: int) -> None:
        self.path, self.src_pad, self.tgt_pad = path, src_pad, tgt_pad
        self._model: Any = None

    @property
    def model(self) -> Any:
        """The MarianMTModel of the directory, eval mode."""
        if self._model is None:
            from transformers import MarianMTModel

            self._model = MarianMTModel.from_pretrained(self.path, local_files_only=True).eval()
        return self._model

    @torch.inference_mode()
    def logits(self, src_ids: Any, tgt_in: Any) -> Tensor:
        """src_ids int64 (B, S) right-padded, tgt_in int64 (B, T) from `<s>`, edgeseq ids
        (torch or numpy) -> float32 (B, T, V) in edgeseq ids; `<pad>` and `<s>` SUPPRESSED."""
        src = torch.as_tensor(src_ids, dtype=torch.int64)
        tgt = torch.as_tensor(tgt_in, dtype=torch.int64)
        out = self.model(
            input_ids=_to_marian(src, self.src_pad),
            attention_mask=(src != 0).long(),
            decoder_input_ids=_to_marian(tgt, self.tgt_pad),  # <s> -> pad: the decoder start
        ).logits  # (B, T, V - 1); no target padding mask: right pads sit behind the causal mask
        logits = out[..., _rows(self.tgt_pad + 2)].float()
        logits[..., :2] = SUPPRESSED  # banned by Marian's generate; ours: exactly this
        return logits

    @torch.inference_mode()
    def generate(
        self, sources: list[list[int]], beam_size: int, max_new_tokens: int
    ) -> list[list[int]] | None:
        """MarianMTModel.generate's ids for `sources` (edgeseq ids, ending with `</s>`), in
        edgeseq ids without the decoder start and `</s>`. forced_eos_token_id is off: at the
        cap both engines return max_new_tokens tokens."""
        width = max(map(len, sources))
        src = torch.tensor([list(s) + [0] * (width - len(s)) for s in sources])
        out = self.model.generate(
            input_ids=_to_marian(src, self.src_pad),
            attention_mask=(src != 0).long(),
            **parity_generate_kwargs(beam_size, max_new_tokens, [[self.tgt_pad]]),
        )
        eos = 0  # Marian's </s>
        rows = []
        for row in out[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            rows.append([m + 2 for m in row if m != self.tgt_pad])
        return rows


def _to_marian(ids: Tensor, pad: int) -> Tensor:
    """edgeseq ids -> Marian's: 0 and 1 -> pad, e >= 2 -> e - 2."""
    return torch.where(ids <= 1, pad, ids - 2)
