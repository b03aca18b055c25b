"""The M2M-100 adapter: a Hugging Face M2M100ForConditionalGeneration directory
(`save_pretrained`'s layout: config.json with model_type m2m_100, model.safetensors or
pytorch_model.bin, and the NLLB tokenizer's tokenizer.json + tokenizer_config.json, or
M2M100Tokenizer's vocab.json + sentencepiece.bpe.model: m2m_100_spm.py), mapped onto
`Seq2SeqTransformer`. NLLB-200 checkpoints are this model class with NllbTokenizer.

    source = load(Path("nllb-200-distilled-600M"))   # SourceModel; reference wraps the source
    source.languages            # {"codes": {"fra_Latn": 503, ...}, "source_prefix": true, ...}

The map: pre-norm layers with a final layer norm on each stack, token embeddings x
sqrt(d_model) when scale_embedding, the activation (relu, gelu, gelu_new, swish/silu), biases
everywhere, no output bias. Positions: M2M-100's sinusoidal table ([sin half | cos half] with
log(10000) / (d/2 - 1), the pad row zero) indexed from padding_idx + 1; its rows pad + 1 ..
pad + max_position_embeddings are stored as a learned table (positional "learned").

Ids (m2m_100_tokenizer.py): the source's `<s>` 0 and `<pad>` 1 swap places so that edgeseq's
`<pad>` `<s>` `</s>` `<unk>` are 0..3; every other id is unchanged. M2M-100 starts decoding
from `</s>` (decoder_start_token_id), the bundle's `decoder_start_id`: a `<s>` the model
generates mid-output keeps its own embedding, as in the source.

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

from . import SourceError, SourceModel
from .bart_family import (
    ACTIVATIONS,
    START_ID,
    FairseqWeights,
    SwappedReference,
    check_tokenizer,
    fill_model,
    read_hf_config,
    swapped_source,
)
from .hf_checkpoint import config_model_type, read_weights, stack_fields

NAME = "m2m_100"
# M2M100Config's defaults, for keys a config.json leaves out.
M2M_DEFAULTS: dict[str, Any] = {"activation_function": "relu", "scale_embedding": True}
M2M_DEFAULTS |= {"tie_word_embeddings": True, "max_position_embeddings": 1024}
M2M_DEFAULTS |= {"pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}
POSITION_KEYS = ("model.encoder.embed_positions.weights", "model.decoder.embed_positions.weights")


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
    source_lang = languages["default_source"]
    checked = check_tokenizer(path, tokenizer, [languages["codes"][source_lang]], source_lang)
    model = m2m_model(config, read_weights(path))
    target = languages["default_target"] or next(iter(languages["codes"]))
    reference = SwappedReference(
        path, "M2M100ForConditionalGeneration", (languages["codes"][target],)
    )
    return swapped_source(
        path, NAME, "M2M-100", model, tokenizer, checked, pad_rows, reference, languages
    )


def read_config(path: Path) -> dict[str, Any]:
    """config.json, refused unless it describes an M2M-100 model this map reproduces."""
    config = read_hf_config(path, (NAME,), NAME, M2M_DEFAULTS)
    if config["d_model"] % 2:
        raise SourceError(f"config.json d_model {config['d_model']} is odd: not mapped")
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
        tie_output=bool(config["tie_word_embeddings"]),
        scale_embedding=bool(config["scale_embedding"]),
        output_bias=False,
        decoder_start_id=START_ID,
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
    weights = _M2MWeights(state, "M2M-100")
    pad = config["pad_token_id"]
    positions = m2m_positions(cfg.max_len + pad + 1, cfg.d_model, pad)[pad + 1 :]
    model = fill_model(cfg, config, weights, (positions, positions))
    weights.check_positions(cfg.max_len + pad + 1, cfg.d_model, pad)
    weights.check_all_used(bool(config["tie_word_embeddings"]))
    return model


class _M2MWeights(FairseqWeights):
    """An M2M-100 state_dict (FairseqWeights) whose positional tables, if stored, must be the
    formula's."""

    def check_positions(self, rows: int, d_model: int, pad: int) -> None:
        """Stored positional tables (transformers leaves them out) must be the formula's."""
        for key in POSITION_KEYS:
            if key in self.state:
                stored = self.take(key).float()
                want = m2m_positions(max(rows, stored.shape[0]), d_model, pad)[: stored.shape[0]]
                if not torch.allclose(stored, want, atol=1e-6):
                    raise SourceError(f"the weights' {key} is not M2M-100's sinusoidal table")
