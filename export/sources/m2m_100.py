"""The M2M-100 adapter: a Hugging Face M2M100ForConditionalGeneration directory
(`save_pretrained`'s layout: config.json with model_type m2m_100, model.safetensors or
pytorch_model.bin, and the NLLB tokenizer's tokenizer.json + tokenizer_config.json), mapped
onto `Seq2SeqTransformer`. NLLB-200 checkpoints are this model class with NllbTokenizer.

    source = load(Path("nllb-200-distilled-600M"))   # SourceModel; reference wraps the source
    source.languages            # {"codes": {"fra_Latn": 503, ...}, "source_prefix": true, ...}

The map: pre-norm layers with a final layer norm on each stack, token embeddings x
sqrt(d_model) when scale_embedding, the activation (relu, gelu, gelu_new, swish/silu), biases
everywhere, no output bias. Positions: M2M-100's sinusoidal table ([sin half | cos half] with
log(10000) / (d/2 - 1), the pad row zero) indexed from padding_idx + 1; its rows pad + 1 ..
pad + max_position_embeddings are stored as a learned table (positional "learned").

Ids (m2m_100_tokenizer.py): the source's `<s>` 0 and `<pad>` 1 swap places so that edgeseq's
`<pad>` `<s>` `</s>` `<unk>` are 0..3; every other id is unchanged. M2M-100 starts decoding
from `</s>` (decoder_start_token_id): edgeseq's start token `<s>` (1) therefore gets the
`</s>` row in the target embedding while the output projection keeps the source's rows (the
`<s>` row at column 1), so the output is untied (one more vocabulary x d_model table). One
consequence: if the source ever generated `<s>` mid-output, edgeseq would embed it as `</s>`
(NLLB and M2M-100 are not trained to emit `<s>`; parity level 3 would show it).

The target language is forced as the first generated token (runtime/prefix.py), with
log-probability 0 as transformers' forced_bos_token_id gives it; the reference's `generate`
forces the same token and `target_prefix` tells parity to force it in edgeseq's search.

Refused with one line naming the field or file: another model_type, an activation not in
ACTIVATIONS, encoder and decoder of different heads or FFN widths, a decoder start other
than `</s>`, odd d_model, missing weights or weights the map does not use, a tokenizer with
more ids than the embedding has rows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.tokenizer import TokenizerPair

from . import SourceError, SourceModel
from .hf_checkpoint import SourceWeights, config_model_type, read_hf_config
from .marian import DECODER_MAP, ENCODER_MAP, read_weights, stack_fields, weights_file

NAME = "m2m_100"
# M2M100Config's defaults, for keys a config.json leaves out.
M2M_DEFAULTS: dict[str, Any] = {"activation_function": "relu", "scale_embedding": True}
M2M_DEFAULTS |= {"tie_word_embeddings": True, "max_position_embeddings": 1024}
M2M_DEFAULTS |= {"pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu-tanh"}
ACTIVATIONS |= {"swish": "silu", "silu": "silu"}
# BEAM_OPTIONS as Marian's: edgeseq's beam search stops an input at beam_size finished.
BEAM_OPTIONS = {"length_penalty": 1.0, "early_stopping": True}
POSITION_KEYS = ("model.encoder.embed_positions.weights", "model.decoder.embed_positions.weights")
TABLE_KEYS = ("model.shared.weight", "model.encoder.embed_tokens.weight")
TABLE_KEYS += ("model.decoder.embed_tokens.weight",)


def detect(path: Path) -> bool:
    """A directory whose config.json says model_type m2m_100."""
    return config_model_type(path) == NAME


def load(path: Path, **options: Any) -> SourceModel:
    """The checkpoint as a Seq2SeqTransformer (eval, CPU), its tokenizer in edgeseq ids, its
    language list (`SourceModel.languages`) and a reference wrapping the source model."""
    from .m2m_100_tokenizer import m2m_tokenizer

    path = Path(path)
    config = read_config(path)
    tokenizer, languages, pad_rows = m2m_tokenizer(path, config["vocab_size"])
    checked = _check_tokenizer(path, tokenizer, languages)
    model = m2m_model(config, read_weights(path))
    target = languages["default_target"] or next(iter(languages["codes"]))
    reference = M2M100Reference(path, (languages["codes"][target],))
    description = f"Hugging Face M2M-100 checkpoint {path} (tokenizer: {checked})"
    if pad_rows:
        description += f" ({pad_rows} embedding rows without a token)"
    tokenizers = TokenizerPair(tokenizer, tokenizer)
    weights = (weights_file(path),)
    return SourceModel(
        model, tokenizers, None, NAME, description, reference, weights, languages=languages
    )


def _check_tokenizer(path: Path, tokenizer: Any, languages: dict[str, Any]) -> str:
    """Refuse a converted tokenizer whose ids differ from transformers' on CHECK_TEXTS; say
    how many matched (or why nothing was checked)."""
    from .m2m_100_tokenizer import CHECK_TEXTS, check_ids

    try:
        import transformers  # noqa: F401
    except ImportError:
        return "not checked, transformers is not installed"
    texts = list(CHECK_TEXTS)
    matched = check_ids(path, tokenizer, texts, languages["default_source"])
    if matched != len(texts):
        raise SourceError(
            f"the converted tokenizer gives transformers' ids on {matched} of {len(texts)} "
            "check texts only: report it with the checkpoint's tokenizer files"
        )
    return f"ids equal to transformers' on {matched}/{len(texts)} check texts"


def read_config(path: Path) -> dict[str, Any]:
    """config.json, refused unless it describes an M2M-100 model this map reproduces."""
    config = M2M_DEFAULTS | read_hf_config(path, (NAME,), NAME)
    activation = config["activation_function"]
    if activation not in ACTIVATIONS:
        raise SourceError(
            f"config.json activation_function {activation!r} is not mapped (edgeseq has "
            f"{', '.join(ACTIVATIONS)}): use a checkpoint with one of them"
        )
    for ours, enc, dec in (
        ("n_heads", "encoder_attention_heads", "decoder_attention_heads"),
        ("d_ff", "encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(enc) != config.get(dec):
            raise SourceError(f"config.json {enc} != {dec}: edgeseq needs one {ours} for both")
    start, eos = config["decoder_start_token_id"], config["eos_token_id"]
    if start != eos:
        raise SourceError(
            f"config.json decoder_start_token_id {start} is not </s> ({eos}): not mapped "
            "(edgeseq maps M2M-100's start from </s>)"
        )
    if config["d_model"] % 2:
        raise SourceError(f"config.json d_model {config['d_model']} is odd: not mapped")
    if (config["pad_token_id"], eos) != (1, 2):
        raise SourceError(
            f"config.json pad_token_id {config['pad_token_id']} / eos_token_id {eos} are not "
            "M2M-100's 1 / 2: not mapped"
        )
    return config


def model_config(config: dict[str, Any]) -> ModelConfig:
    """Our ModelConfig of a (checked) M2M-100 config.json."""
    return ModelConfig(
        src_vocab_size=config["vocab_size"],
        tgt_vocab_size=config["vocab_size"],
        **stack_fields(config),
        positional="learned",
        norm="pre",
        activation=ACTIVATIONS[config["activation_function"]],
        tie_output=False,
        scale_embedding=bool(config["scale_embedding"]),
        output_bias=False,
    ).validate()


def m2m_positions(rows: int, d_model: int, pad: int) -> Tensor:
    """M2M100SinusoidalPositionalEmbedding's table (rows, D) in its float32 arithmetic."""
    half = d_model // 2
    scale = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -scale)
    angles = torch.arange(rows, dtype=torch.int64).float().unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).view(rows, -1)
    table[pad] = 0
    return table


def m2m_model(config: dict[str, Any], state: dict[str, Tensor]) -> Seq2SeqTransformer:
    """A Seq2SeqTransformer holding the M2M-100 weights `state`, rows in edgeseq ids."""
    cfg = model_config(config)
    weights = _M2MWeights(state)
    vocab = config["vocab_size"]
    table = weights.take_table(vocab)
    rows = source_rows(vocab)
    model = Seq2SeqTransformer(cfg)
    params = dict(model.named_parameters())
    pad = config["pad_token_id"]
    positions = m2m_positions(cfg.max_len + pad + 1, cfg.d_model, pad)[pad + 1 :]
    with torch.no_grad():
        params["src_embed.weight"].copy_(table[rows])
        start_rows = rows.clone()
        start_rows[1] = config["decoder_start_token_id"]  # edgeseq's <s> embeds </s>
        params["tgt_embed.weight"].copy_(table[start_rows])
        params["src_pos.table"].copy_(positions)
        params["tgt_pos.table"].copy_(positions)
        for side, layers, mapping in (
            ("encoder", cfg.n_encoder_layers, ENCODER_MAP),
            ("decoder", cfg.n_decoder_layers, DECODER_MAP),
        ):
            for i in range(layers):
                for ours, theirs in mapping.items():
                    for kind in ("weight", "bias"):
                        value = weights.take(f"model.{side}.layers.{i}.{theirs}.{kind}")
                        params[f"{side}_layers.{i}.{ours}.{kind}"].copy_(value)
            for kind in ("weight", "bias"):
                params[f"{side}_norm.{kind}"].copy_(weights.take(f"model.{side}.layer_norm.{kind}"))
        tied = bool(config["tie_word_embeddings"])
        output = table if tied else weights.take("lm_head.weight")
        params["output.weight"].copy_(output[rows])
    weights.check_positions(cfg.max_len + pad + 1, cfg.d_model, pad)
    weights.check_all_used_but_tables(tied)
    return model.eval()


def source_rows(size: int) -> Tensor:
    """The source's id of each edgeseq id 0..size-1: `<s>` 0 and `<pad>` 1 swapped."""
    rows = torch.arange(size)
    rows[0], rows[1] = 1, 0
    return rows


class _M2MWeights(SourceWeights):
    """An M2M-100 state_dict, read by name; remembers which keys the map used."""

    def __init__(self, state: dict[str, Tensor]) -> None:
        super().__init__(state, "M2M-100")
        self.table_key = next((k for k in TABLE_KEYS if k in state), TABLE_KEYS[0])

    def take_table(self, rows: int) -> Tensor:
        """The shared token table (rows, D)."""
        table = self.take(self.table_key)
        if table.shape[0] != rows:
            raise SourceError(f"{self.table_key} has {table.shape[0]} rows; config.json: {rows}")
        return table

    def check_positions(self, rows: int, d_model: int, pad: int) -> None:
        """Stored positional tables (transformers leaves them out) must be the formula's."""
        for key in POSITION_KEYS:
            if key in self.state:
                stored = self.take(key).float()
                want = m2m_positions(max(rows, stored.shape[0]), d_model, pad)[: stored.shape[0]]
                if not torch.allclose(stored, want, atol=1e-6):
                    raise SourceError(f"the weights' {key} is not M2M-100's sinusoidal table")

    def check_all_used_but_tables(self, tied: bool) -> None:
        """Refuse weights the map did not use, except copies of the shared table."""
        copies = set(TABLE_KEYS) | ({"lm_head.weight"} if tied else set())
        self.check_all_used(dict.fromkeys(copies, self.table_key))


# -- the reference ---------------------------------------------------------------------------
class M2M100Reference:
    """`SourceReference` over transformers' M2M100ForConditionalGeneration, in edgeseq ids
    (loaded when first used). `target_prefix`: the target-language token forced first (edgeseq
    ids): the checkpoint's default target language, else its first language code."""

    def __init__(self, path: Path, target_prefix: tuple[int, ...]) -> None:
        self.path, self.target_prefix = path, target_prefix
        self._model: Any = None

    @property
    def model(self) -> Any:
        """The M2M100ForConditionalGeneration of the directory, eval mode."""
        if self._model is None:
            from transformers import M2M100ForConditionalGeneration

            self._model = M2M100ForConditionalGeneration.from_pretrained(
                self.path, local_files_only=True
            ).eval()
        return self._model

    @torch.inference_mode()
    def logits(self, src_ids: Any, tgt_in: Any) -> Tensor:
        """src_ids int64 (B, S) right-padded, tgt_in int64 (B, T) from `<s>`, edgeseq ids
        (torch or numpy) -> float32 (B, T, V) in edgeseq ids. The leading `<s>` becomes the
        source's decoder start `</s>`."""
        src = torch.as_tensor(src_ids, dtype=torch.int64)
        tgt = _to_m2m(torch.as_tensor(tgt_in, dtype=torch.int64))
        tgt[:, 0] = self.model.config.decoder_start_token_id
        out = self.model(
            input_ids=_to_m2m(src), attention_mask=(src != 0).long(), decoder_input_ids=tgt
        ).logits  # right pads of tgt sit behind the causal mask
        return out[..., source_rows(out.shape[-1])].float()

    @torch.inference_mode()
    def generate(
        self, sources: list[list[int]], beam_size: int, max_new_tokens: int
    ) -> list[list[int]]:
        """The source's generate for `sources` (edgeseq ids ending with `</s>`) with the
        target language forced first, in edgeseq ids without the start token and `</s>`."""
        width = max(map(len, sources))
        src = torch.tensor([list(s) + [0] * (width - len(s)) for s in sources])
        forced = {"forced_bos_token_id": _to_m2m(torch.tensor(self.target_prefix[:1]))}
        out = self.model.generate(
            input_ids=_to_m2m(src),
            attention_mask=(src != 0).long(),
            max_new_tokens=max_new_tokens,
            max_length=None,
            do_sample=False,
            forced_eos_token_id=None,
            num_return_sequences=1,
            **({k: int(v[0]) for k, v in forced.items()} if self.target_prefix else {}),
            **(BEAM_OPTIONS | {"num_beams": beam_size} if beam_size > 1 else {"num_beams": 1}),
        )
        eos = self.model.config.eos_token_id
        rows = []
        for row in out[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            rows.append(_to_m2m(torch.tensor(row, dtype=torch.int64)).tolist() if row else [])
        return rows


def _to_m2m(ids: Tensor) -> Tensor:
    """edgeseq ids <-> the source's (the swap of 0 and 1 is its own inverse)."""
    out = ids.clone()
    out[ids == 0], out[ids == 1] = 1, 0
    return out
