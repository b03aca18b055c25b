"""The T5 adapter: a Hugging Face T5ForConditionalGeneration / MT5ForConditionalGeneration
directory (`save_pretrained`'s layout: config.json with model_type t5 or mt5,
model.safetensors or pytorch_model.bin, tokenizer.json), mapped onto `Seq2SeqTransformer`.
T5 v1.0, T5 v1.1, Flan-T5 and mT5 checkpoints are this layout.

    source = load(Path("flan-t5-base"))      # SourceModel; reference wraps the source model

The map: pre-norm layers with RMS norms (norm_type "rms") and a final norm on each stack, no
embedding scaling, no biases anywhere (ours are zero: exact), T5's relative position bias
(positional "relative": relative_attention_num_buckets, relative_attention_max_distance, the
table of each stack's first layer), the feed-forward of feed_forward_proj ("relu": plain ReLU,
v1.0; "gated-gelu": gated with the tanh GELU, v1.1 / Flan-T5 / mT5; any "[gated-]act" whose
activation edgeseq has), heads d_kv wide (head_dim when d_kv x num_heads != d_model, as in
Flan-T5-small and mT5-small). T5 does not divide Q Kᵀ by sqrt(d_kv): the query weights are
multiplied by sqrt(d_kv) instead (exact up to float32 rounding). The output is lm_head.weight
when the file has one, else the shared table; when the checkpoint scales the decoder output
by d_model^-0.5 (T5 v1.0's tied output: scale_decoder_outputs, else tie_word_embeddings not
false) the scale is folded into the output weights. `max_len` is n_positions (512 when
absent), the default token budget: T5 has no positional table, so sources and outputs may be
longer, as in transformers (`ModelConfig.max_positions`).

Ids: T5 numbers `<pad>` 0, `</s>` 1, `<unk>` 2 and has no `<s>`; decoding starts from
`<pad>` (decoder_start_token_id). edgeseq adds `<s>` at id 1 (renumber.py) and shifts every
other id up by one: edgeseq e = T5 s + 1 for s >= 1. The target embedding's `<s>` row is the
`<pad>` row (the start), as M2M-100's adapter gives its `<s>` the `</s>` row; the output
column of `<s>` is zero plus a bias of SUPPRESSED, so edgeseq never generates it and the other
columns' softmax is unchanged (the reference's column is SUPPRESSED too).

Refused with one line naming the field or file: another model_type, a feed_forward_proj not
of the form [gated-]act or with an activation edgeseq lacks, pad / eos /
decoder start other than T5's 0 / 1 / 0, missing weights or weights the map does not use, a
tokenizer with more ids than the embedding has rows or whose special tokens are not T5's ids.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

from . import SourceError, SourceModel
from .generation_config import parity_generate_kwargs, read_generation
from .hf_checkpoint import (
    SourceWeights,
    config_model_type,
    read_typed_config,
    read_weights,
    weights_file,
)
from .m2m_100_tokenizer import CHECK_TEXTS
from .marian import SUPPRESSED
from .renumber import pad_vocabulary, read_vocabulary

NAME = "t5"
MODEL_TYPES = ("t5", "mt5")
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu-tanh", "silu": "silu"}
ACTIVATIONS |= {"swish": "silu", "gelu_pytorch_tanh": "gelu-tanh"}
T5_DEFAULTS: dict[str, Any] = {"feed_forward_proj": "relu", "layer_norm_epsilon": 1e-6}
T5_DEFAULTS |= {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128}
T5_DEFAULTS |= {"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
T5_DEFAULTS |= {"n_positions": 512}
REQUIRED = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
SPECIALS: dict[str, str | None] = {"pad": "<pad>", "bos": None, "eos": "</s>", "unk": "<unk>"}
TOKENIZER_JSON = "tokenizer.json"
TABLE_KEYS = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)
# Our parameter -> T5's, per layer: (encoder layer map, decoder layer map), FFN by kind.
ATTENTION = {"w_q": "q", "w_k": "k", "w_v": "v", "w_o": "o"}
FFN = {"plain": {"w_1": "wi", "w_2": "wo"}, "gated": {"w_1": "wi_0", "w_3": "wi_1", "w_2": "wo"}}


def detect(path: Path) -> bool:
    """A directory whose config.json says model_type t5 or mt5."""
    return config_model_type(path) in MODEL_TYPES


def load(path: Path, **options: Any) -> SourceModel:
    """The checkpoint as a Seq2SeqTransformer (eval, CPU), its tokenizer in edgeseq ids and a
    reference wrapping the source model (loaded when first used)."""
    path = Path(path)
    config = read_config(path)
    tokenizer, padded = t5_tokenizer(path, config["vocab_size"])
    model = t5_model(config, read_weights(path))
    checked = _check_tokenizer(path, tokenizer)
    kind = "gated" if model.cfg.ffn == "gated" else "plain"
    description = (
        f"Hugging Face {config['model_type']} checkpoint {path} ({kind} {model.cfg.activation} "
        f"feed-forward; tokenizer: {checked})"
    )
    if padded:
        description += f" ({padded} embedding rows without a token)"
    reference = T5Reference(path)
    tokenizers = TokenizerPair(tokenizer, tokenizer)
    weights = (weights_file(path),)
    # T5's </s> is 1; edgeseq's added <s> (1) is never output
    generation = read_generation(path, lambda i: to_edgeseq([i])[0], 1, never_generated=(1,))
    return SourceModel(
        model, tokenizers, None, NAME, description, reference, weights, generation=generation,
        task_prefixes=task_prefixes(config),
    )  # fmt: skip


# -- config.json ------------------------------------------------------------------------------
def feed_forward(config: dict[str, Any]) -> tuple[str, str]:
    """(ffn, activation) of edgeseq for config.json's feed_forward_proj, as T5Config reads it
    ("gated-gelu" means the tanh GELU, gelu_new)."""
    proj = config["feed_forward_proj"]
    parts = str(proj).split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise SourceError(
            f"config.json feed_forward_proj {proj!r} is not of the form ACT or gated-ACT: "
            "not mapped"
        )
    activation = "gelu_new" if proj == "gated-gelu" else parts[-1]
    if activation not in ACTIVATIONS:
        raise SourceError(
            f"config.json feed_forward_proj {proj!r}: activation {activation!r} is not mapped "
            f"(edgeseq has {', '.join(ACTIVATIONS)}): use a checkpoint with one of them"
        )
    return ("gated" if len(parts) == 2 else "plain"), ACTIVATIONS[activation]


def read_config(path: Path) -> dict[str, Any]:
    """config.json, refused unless it describes a T5 model this map reproduces."""
    config = T5_DEFAULTS | read_typed_config(path, MODEL_TYPES, NAME)
    missing = [key for key in REQUIRED if not isinstance(config.get(key), int)]
    if missing:
        raise SourceError(f"config.json lacks {', '.join(missing)} (integers): not a T5 config")
    feed_forward(config)
    ids = tuple(config[k] for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id"))
    if ids != (0, 1, 0):
        raise SourceError(
            f"config.json pad_token_id / eos_token_id / decoder_start_token_id are {ids}, not "
            "T5's (0, 1, 0): not mapped"
        )
    return config


def model_config(config: dict[str, Any]) -> ModelConfig:
    """Our ModelConfig of a (checked) T5 config.json: one more id than the source (`<s>`)."""
    ffn, activation = feed_forward(config)
    d_kv = config["d_kv"]
    return ModelConfig(
        src_vocab_size=config["vocab_size"] + 1,
        tgt_vocab_size=config["vocab_size"] + 1,
        d_model=config["d_model"],
        n_heads=config["num_heads"],
        n_encoder_layers=config["num_layers"],
        n_decoder_layers=config.get("num_decoder_layers") or config["num_layers"],
        d_ff=config["d_ff"],
        dropout=0.0,
        max_len=config["n_positions"],
        positional="relative",
        norm="pre",
        activation=activation,
        tie_output=False,
        layer_norm_eps=config["layer_norm_epsilon"],
        scale_embedding=False,
        final_norm=True,
        output_bias=True,
        norm_type="rms",
        ffn=ffn,
        relative_buckets=config["relative_attention_num_buckets"],
        relative_max_distance=config["relative_attention_max_distance"],
        head_dim=None if d_kv * config["num_heads"] == config["d_model"] else d_kv,
    ).validate()


def task_prefixes(config: dict[str, Any]) -> dict[str, str]:
    """config.json's task_specific_params as task name -> prefix (e.g. translation_en_to_de
    -> "translate English to German: "), the tasks that have a text prefix; a task's other
    settings (max_length, num_beams, ...) are not carried over."""
    params = config.get("task_specific_params") or {}
    if not isinstance(params, dict):
        raise SourceError("config.json task_specific_params is not an object: not mapped")
    return {
        str(name): entry["prefix"]
        for name, entry in params.items()
        if isinstance(entry, dict) and isinstance(entry.get("prefix"), str) and entry["prefix"]
    }


def scales_output(config: dict[str, Any]) -> bool:
    """Whether the source multiplies the decoder output by d_model^-0.5 before lm_head: T5
    v1.0's tied output (transformers 5 writes scale_decoder_outputs; older configs say
    tie_word_embeddings, true by default)."""
    if "scale_decoder_outputs" in config:
        return bool(config["scale_decoder_outputs"])
    return config.get("tie_word_embeddings", True) is not False


# -- the weight map ---------------------------------------------------------------------------
def source_rows(size: int) -> Tensor:
    """T5's row of each edgeseq id 0..size-1: `<pad>` twice (`<pad>` and `<s>`), then e - 1."""
    ids = torch.arange(size)
    return torch.where(ids <= 1, 0, ids - 1)


def t5_model(config: dict[str, Any], state: dict[str, Tensor]) -> Seq2SeqTransformer:
    """A Seq2SeqTransformer holding the T5 weights `state`, rows in edgeseq ids."""
    cfg = model_config(config)
    weights = SourceWeights(state, "T5")
    table_key = next((k for k in TABLE_KEYS if k in state), TABLE_KEYS[0])
    table = weights.take(table_key)
    if table.shape[0] != config["vocab_size"]:
        raise SourceError(f"{table_key} has {table.shape[0]} rows; config.json: vocab_size")
    rows = source_rows(cfg.tgt_vocab_size)
    model = Seq2SeqTransformer(cfg)
    params = dict(model.named_parameters())
    query_scale = math.sqrt(cfg.d_head)  # T5 leaves Q Kᵀ unscaled; edgeseq divides by this
    with torch.no_grad():
        params["src_embed.weight"].copy_(table[rows])
        params["tgt_embed.weight"].copy_(table[rows])  # <s> embeds <pad>: T5's start
        stacks = (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers))
        for side, n_layers in stacks:
            bias = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            params[f"{side}_relative.weight"].copy_(weights.take(bias))
            params[f"{side}_norm.weight"].copy_(weights.take(f"{side}.final_layer_norm.weight"))
            for i in range(n_layers):
                for ours, theirs in _layer_map(side, cfg.ffn).items():
                    value = weights.take(f"{side}.block.{i}.layer.{theirs}.weight")
                    scale = query_scale if ours.endswith("attn.w_q") else 1.0
                    params[f"{side}_layers.{i}.{ours}.weight"].copy_(value * scale)
        output = weights.take("lm_head.weight") if "lm_head.weight" in state else table
        scale = config["d_model"] ** -0.5 if scales_output(config) else 1.0
        params["output.weight"].copy_(output[rows] * scale)
        params["output.weight"][1] = 0.0
        params["output.bias"].zero_()
        params["output.bias"][1] = SUPPRESSED  # <s>: never generated
    weights.check_all_used(dict.fromkeys(TABLE_KEYS, table_key), IGNORED)
    return model.eval()


def _layer_map(side: str, ffn: str) -> dict[str, str]:
    """Our parameter (without `.weight`) -> T5's `layer.{n}.{name}` of one block."""
    mapping = {f"self_attn.{ours}": f"0.SelfAttention.{t}" for ours, t in ATTENTION.items()}
    mapping["sub_attn.norm" if side == "encoder" else "sub_self.norm"] = "0.layer_norm"
    ffn_layer = 1 if side == "encoder" else 2
    if side == "decoder":
        mapping |= {f"cross_attn.{ours}": f"1.EncDecAttention.{t}" for ours, t in ATTENTION.items()}
        mapping["sub_cross.norm"] = "1.layer_norm"
    mapping |= {f"ffn.{ours}": f"{ffn_layer}.DenseReluDense.{t}" for ours, t in FFN[ffn].items()}
    mapping["sub_ffn.norm"] = f"{ffn_layer}.layer_norm"
    return mapping


# -- the tokenizer ----------------------------------------------------------------------------
def t5_tokenizer(path: Path, vocab_size: int) -> tuple[Tokenizer, int]:
    """The checkpoint's tokenizer.json in edgeseq ids (`<s>` added at 1, every T5 id s >= 1
    at s + 1), padded to the embedding's rows + 1; (tokenizer, unused ids added)."""
    file = path / TOKENIZER_JSON
    if not file.is_file():
        raise SourceError(
            f"{path} has no {TOKENIZER_JSON}: write one with transformers "
            "(AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)) and export again"
        )
    vocabulary = read_vocabulary(file, SPECIALS)
    found = {role: vocabulary.specials[role] for role in ("pad", "eos", "unk")}
    if found != {"pad": 0, "eos": 1, "unk": 2}:
        raise SourceError(
            f"{file}: <pad> </s> <unk> have ids {tuple(found.values())}, not T5's (0, 1, 2): "
            "the tokenizer does not fit the weights (use the checkpoint's own tokenizer)"
        )
    tokenizer = vocabulary.tokenizer()
    return tokenizer, pad_vocabulary(tokenizer, vocab_size + 1, file)


def _check_tokenizer(path: Path, tokenizer: Tokenizer) -> str:
    """Refuse a converted tokenizer whose ids differ from transformers' on CHECK_TEXTS; say
    how many matched (or why nothing was checked)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return "not checked, transformers is not installed"
    source = AutoTokenizer.from_pretrained(path, local_files_only=True)
    texts = list(CHECK_TEXTS)
    matched = sum(
        to_edgeseq(source(text).input_ids) == [*tokenizer.encode(text), tokenizer.eos_id]
        for text in texts
    )
    if matched != len(texts):
        raise SourceError(
            f"the converted tokenizer gives transformers' ids on {matched} of {len(texts)} "
            "check texts only: report it with the checkpoint's tokenizer files"
        )
    return f"ids equal to transformers' on {matched}/{len(texts)} check texts"


def to_edgeseq(ids: list[int]) -> list[int]:
    """T5 ids -> edgeseq's: `<pad>` 0 stays, s >= 1 -> s + 1."""
    return [i + 1 if i >= 1 else 0 for i in ids]


# -- the reference ----------------------------------------------------------------------------
class T5Reference:
    """`SourceReference` over transformers' T5ForConditionalGeneration (MT5 for mt5), in
    edgeseq ids (loaded when first used: transformers is needed for parity only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._model: Any = None

    @property
    def model(self) -> Any:
        """The source model of the directory, eval mode."""
        if self._model is None:
            from transformers import AutoModelForSeq2SeqLM

            self._model = AutoModelForSeq2SeqLM.from_pretrained(
                self.path, local_files_only=True
            ).eval()
        return self._model

    @torch.inference_mode()
    def logits(self, src_ids: Any, tgt_in: Any) -> Tensor:
        """src_ids int64 (B, S) right-padded, tgt_in int64 (B, T) from `<s>`, edgeseq ids
        (torch or numpy) -> float32 (B, T, V + 1) in edgeseq ids, `<s>` SUPPRESSED. The
        leading `<s>` becomes T5's decoder start `<pad>`."""
        src = torch.as_tensor(src_ids, dtype=torch.int64)
        tgt = torch.as_tensor(tgt_in, dtype=torch.int64)
        out = self.model(
            input_ids=_to_t5(src), attention_mask=(src != 0).long(), decoder_input_ids=_to_t5(tgt)
        ).logits  # right pads of tgt sit behind the causal mask
        logits = out[..., source_rows(out.shape[-1] + 1)].float()
        logits[..., 1] = SUPPRESSED
        return logits

    @torch.inference_mode()
    def generate(
        self, sources: list[list[int]], beam_size: int, max_new_tokens: int
    ) -> list[list[int]]:
        """The source's generate for `sources` (edgeseq ids ending with `</s>`), in edgeseq
        ids without the start token and `</s>`; beams stop as edgeseq's (parity_generate_kwargs)."""
        width = max(map(len, sources))
        src = torch.tensor([list(s) + [0] * (width - len(s)) for s in sources])
        out = self.model.generate(
            input_ids=_to_t5(src),
            attention_mask=(src != 0).long(),
            **parity_generate_kwargs(beam_size, max_new_tokens),
        )
        eos = 1  # T5's </s>
        rows = []
        for row in out[:, 1:].tolist():
            rows.append(to_edgeseq(row[: row.index(eos)] if eos in row else row))
        return rows


def _to_t5(ids: Tensor) -> Tensor:
    """edgeseq ids -> T5's: `<pad>` and `<s>` -> 0 (T5's decoder start), e >= 2 -> e - 1."""
    return torch.where(ids <= 1, 0, ids - 1)
