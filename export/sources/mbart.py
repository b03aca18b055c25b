"""The mBART / BART adapter: a Hugging Face directory that `save_pretrained` wrote for
BartForConditionalGeneration (config.json model_type bart, BartTokenizer's byte-level BPE
tokenizer.json) or MBartForConditionalGeneration with MBart50Tokenizer (model_type mbart,
mBART-50's Unigram tokenizer.json and its 52 language codes), mapped onto `Seq2SeqTransformer`.

    source = load(Path("bart-base"))                  # SourceModel; reference wraps BART itself
    source = load(Path("mbart-large-50-many-to-many-mmt"))
    source.languages          # {"codes": {"en_XX": 254, ...}, "source_prefix": true, ...}

The map: learned positions with BART's offset 2 (the stored rows 2 .. 2 + max_position_embeddings
are positions 0.. : positional "learned"), token embeddings x sqrt(d_model) when
scale_embedding, layernorm_embedding on embedding + position in both stacks (embedding_norm),
post-norm layers without final norms (BART) or pre-norm layers with a final layer norm on each
stack (mBART), the activation, the output tied to the shared table plus final_logits_bias.

Ids and the decoder start `</s>` as M2M-100's (bart_family.py: `<s>` and `<pad>` swapped, the
target's `<s>` row is `</s>`'s). BART's sources are `<s> tokens </s>` (config source_bos);
mBART-50's are `[source language] tokens </s>` with the target language forced as the first
generated token, as M2M-100's (runtime/languages.py, runtime/prefix.py).

Refused with one line naming the field or file and what to do: another model_type, an
activation edgeseq lacks, encoder and decoder of different heads or FFN widths, a decoder
start other than `</s>`, a forced first token on a BART model (forced_bos_token_id: edgeseq
cannot feed a generated `<s>` back), an mBART tokenizer other than MBart50Tokenizer (mBART-cc25's
`tokens </s> [language]` layout), a positional table shorter than max_position_embeddings + 2,
missing weights or weights the map does not use, a tokenizer with more ids than the embedding
has rows or ids other than transformers' on the check texts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from .m2m_100_tokenizer import read_json

NAME = "mbart"
MODEL_TYPES = ("mbart", "bart")
POSITION_OFFSET = 2  # BartLearnedPositionalEmbedding: position p is row p + 2
# BartConfig's / MBartConfig's defaults, for keys a config.json leaves out.
BART_DEFAULTS: dict[str, Any] = {"activation_function": "gelu", "scale_embedding": False}
BART_DEFAULTS |= {"tie_word_embeddings": True, "max_position_embeddings": 1024}
BART_DEFAULTS |= {"pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}
MODEL_CLASSES = {"bart": "BartForConditionalGeneration", "mbart": "MBartForConditionalGeneration"}
MBART50_TOKENIZERS = ("MBart50Tokenizer", "MBart50TokenizerFast")
POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def detect(path: Path) -> bool:
    """A directory whose config.json says model_type mbart or bart."""
    return config_model_type(path) in MODEL_TYPES


def load(path: Path, **options: Any) -> SourceModel:
    """The checkpoint as a Seq2SeqTransformer (eval, CPU), its tokenizer in edgeseq ids, its
    language list (mBART-50; None for BART) and a reference wrapping the source model."""
    path = Path(path)
    config = read_config(path)
    kind = config["model_type"]
    tokenizer, languages, pad_rows = _tokenizer(path, config)
    if languages is None:
        checked = check_tokenizer(path, tokenizer, [tokenizer.bos_id])
        prefix: tuple[int, ...] = ()
    else:
        source_lang = languages["default_source"]
        codes = languages["codes"]
        checked = check_tokenizer(path, tokenizer, [codes[source_lang]], source_lang)
        prefix = (codes[languages["default_target"] or next(iter(codes))],)
    model = bart_model(config, read_weights(path))
    reference = SwappedReference(path, MODEL_CLASSES[kind], prefix)
    family = "BART" if kind == "bart" else "mBART-50"
    return swapped_source(
        path, NAME, family, model, tokenizer, checked, pad_rows, reference, languages
    )


def read_config(path: Path) -> dict[str, Any]:
    """config.json (and generation_config.json), refused unless they describe a BART or
    mBART model this map reproduces."""
    config = read_hf_config(path, MODEL_TYPES, NAME, BART_DEFAULTS)
    if config["model_type"] == "bart":
        for file in (path / "config.json", path / "generation_config.json"):
            forced = read_json(file).get("forced_bos_token_id") if file.is_file() else None
            if forced is not None:
                raise SourceError(
                    f"{file.name} forced_bos_token_id is {forced} (BART forcing <s> first) and "
                    "edgeseq forces a first token only for a model with a language list: not "
                    "mapped; fine-tune without it or set it to null if the model does not need it"
                )
    return config


def _tokenizer(path: Path, config: dict[str, Any]) -> tuple[Any, dict[str, Any] | None, int]:
    """(tokenizer in edgeseq ids, the languages for mBART-50 else None, unused ids added)."""
    from .m2m_100_tokenizer import m2m_tokenizer, read_tokenizer_config, swapped_tokenizer

    vocab = config["vocab_size"]
    if config["model_type"] == "bart":
        tokenizer, padded = swapped_tokenizer(path, vocab)
        return tokenizer, None, padded
    kind = read_tokenizer_config(path).get("tokenizer_class")
    if kind not in MBART50_TOKENIZERS:
        raise SourceError(
            f"tokenizer_config.json tokenizer_class is {kind!r}; the mbart adapter reads "
            f"mBART-50's {MBART50_TOKENIZERS[0]} (`[language] tokens </s>`), not mBART-cc25's "
            "MBartTokenizer (`tokens </s> [language]`): use an mBART-50 checkpoint"
        )
    return m2m_tokenizer(path, vocab)


def model_config(config: dict[str, Any]) -> ModelConfig:
    """Our ModelConfig of a (checked) BART or mBART config.json."""
    mbart = config["model_type"] == "mbart"
    return ModelConfig(
        src_vocab_size=config["vocab_size"],
        tgt_vocab_size=config["vocab_size"],
        **stack_fields(config),
        positional="learned",
        norm="pre" if mbart else "post",
        activation=ACTIVATIONS[config["activation_function"]],
        tie_output=bool(config["tie_word_embeddings"]),
        scale_embedding=bool(config["scale_embedding"]),
        output_bias=True,
        embedding_norm=True,
        source_bos=not mbart,
        decoder_start_id=START_ID,
    ).validate()


def bart_model(config: dict[str, Any], state: dict[str, Tensor]) -> Seq2SeqTransformer:
    """A Seq2SeqTransformer holding the BART / mBART weights `state`, rows in edgeseq ids."""
    cfg = model_config(config)
    family = "BART" if config["model_type"] == "bart" else "mBART"
    weights = FairseqWeights(state, family)
    tables = [weights.take(key) for key in POSITION_KEYS]
    want = (cfg.max_len + POSITION_OFFSET, cfg.d_model)
    for key, table in zip(POSITION_KEYS, tables, strict=True):
        if table.shape[0] < want[0] or table.shape[1] != cfg.d_model:
            raise SourceError(
                f"the weights' {key} is {tuple(table.shape)}; max_position_embeddings "
                f"{cfg.max_len} needs {want}: use the checkpoint's own config.json"
            )
    rows = slice(POSITION_OFFSET, POSITION_OFFSET + cfg.max_len)
    model = fill_model(cfg, config, weights, (tables[0][rows], tables[1][rows]))
    weights.check_all_used(bool(config["tie_word_embeddings"]))
    return model
