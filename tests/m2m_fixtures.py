"""Tiny Hugging Face M2M-100 checkpoints with an NLLB tokenizer, built locally (no hub, no
download), laid out as `save_pretrained` leaves an NLLB-200 checkpoint.

    path = build_m2m_dir(tmp_path / "nllb")                     # random weights
    path = build_m2m_dir(tmp_path / "copy", copy_steps=120)    # outputs vary, end in </s>
    NllbTokenizer.from_pretrained(path); M2M100ForConditionalGeneration.from_pretrained(path)

The tokenizer is NllbTokenizer over a SentencePiece BPE model trained here on
hf_fixtures.synthetic_corpus (both made-up languages), with LANGUAGES as its language codes:
tokenizer.json + tokenizer_config.json as transformers writes them. The model is an
M2M100ForConditionalGeneration of NLLB's layout (pre-norm, final layer norms, scaled
embeddings, sinusoidal positions from padding_idx + 1, tied output, decoder start `</s>`)
whose embedding has EXTRA_ROWS more rows than the tokenizer has ids, as NLLB-200's has.
With `copy_steps` the model is trained that many steps (batch 16, ~5 s for 200 on 2 cores)
to copy the first word of a line after the forced target language `fra_Latn`, so that its
outputs depend on the input, have varied lengths and end with `</s>`.
`layout="m2m100"` writes M2M100Tokenizer's files instead (the `facebook/m2m100_*` layout:
vocab.json + sentencepiece.bpe.model + tokenizer_config.json, no tokenizer.json), vocab.json
in fairseq's order (`<s>` `<pad>` `</s>` `<unk>`, then the pieces shuffled, not in
SentencePiece's order), its 100 language codes after the vocabulary and 8 made-up words
(M2M100_TARGET `fr` is the trained target).
Needs torch, transformers and sentencepiece (the `train` and `hf` extras).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from hf_fixtures import synthetic_corpus, train_to_copy

LANGUAGES = ("eng_Latn", "fra_Latn", "deu_Latn", "zho_Hans")
TARGET = "fra_Latn"  # the language the copy model is trained to produce
M2M100_TARGET = "fr"
EXTRA_ROWS = 2
M2M100_MADEUP_WORDS = 8  # M2M100Tokenizer's num_madeup_words: rows after the languages


def train_bpe_spm(lines: list[str], vocab_size: int) -> bytes:
    """A SentencePiece BPE model (NLLB's kind; default nmt_nfkc normalisation)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type="bpe", character_coverage=1.0, num_threads=1, minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


def build_m2m_dir(
    path: str | Path,
    *,
    vocab_size: int = 500,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    copy_steps: int = 0,
    max_positions: int = 64,
    layout: str = "nllb",
) -> Path:
    """Write a tiny M2M-100 / NLLB checkpoint into `path` (created) and return it; `layout`
    "nllb" (NllbTokenizer's tokenizer.json) or "m2m100" (M2M100Tokenizer's files)."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    lines = synthetic_corpus("source", seed=seed) + synthetic_corpus("target", seed=seed)
    spm_model = train_bpe_spm(lines, vocab_size)
    if layout == "m2m100":
        tokenizer, target = m2m100_tokenizer(path, spm_model, seed), M2M100_TARGET
        rows = len(tokenizer.encoder) + len(tokenizer.lang_code_to_id) + M2M100_MADEUP_WORDS
    else:
        tokenizer, target = _nllb_tokenizer(path, spm_model), TARGET
        rows = len(tokenizer) + EXTRA_ROWS
    tokenizer.save_pretrained(path)
    config = M2M100Config(
        vocab_size=rows, d_model=d_model,
        encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
        max_position_embeddings=max_positions, scale_embedding=True,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():  # weights of a trained model's scale; the pad row zero
        model.model.shared.weight.normal_(0.0, 1.0 / d_model**0.5)
        model.model.shared.weight[1].zero_()
    forced = tokenizer.convert_tokens_to_ids(target if layout == "nllb" else f"__{target}__")
    if copy_steps:
        tokenizer.tgt_lang = target
        _train_to_copy(model, tokenizer, copy_steps, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
        max_length=max_positions, forced_bos_token_id=forced,
    )  # fmt: skip
    model.save_pretrained(path)
    return path


def _nllb_tokenizer(path: Path, spm_model: bytes) -> Any:
    """NllbTokenizer over `spm_model` with LANGUAGES, source eng_Latn."""
    from transformers import NllbTokenizer

    spm_dir = path / "spm"
    spm_dir.mkdir(exist_ok=True)
    (spm_dir / "sentencepiece.bpe.model").write_bytes(spm_model)
    tokenizer = NllbTokenizer.from_pretrained(
        str(spm_dir), additional_special_tokens=list(LANGUAGES), src_lang="eng_Latn"
    )
    (spm_dir / "sentencepiece.bpe.model").unlink()
    spm_dir.rmdir()
    return tokenizer


def m2m100_tokenizer(path: Path, spm_model: bytes, seed: int = 0) -> Any:
    """M2M100Tokenizer over `spm_model` with a fairseq-ordered vocab.json (the pieces shuffled
    by `seed`), source `en`, written into `path` as its save_vocabulary does."""
    import random

    from transformers import M2M100Tokenizer

    (path / "sentencepiece.bpe.model").write_bytes(spm_model)
    processor = spm_processor(spm_model)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    normal = [p for i, p in enumerate(pieces) if not processor.is_control(i)]
    normal = [p for p in normal if not processor.is_unknown(processor.piece_to_id(p))]
    random.Random(seed).shuffle(normal)
    fairseq = ["<s>", "<pad>", "</s>", "<unk>", *normal]
    vocab = {piece: i for i, piece in enumerate(fairseq)}
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return M2M100Tokenizer(
        str(path / "vocab.json"), str(path / "sentencepiece.bpe.model"), src_lang="en"
    )


def spm_processor(spm_model: bytes) -> Any:
    """A SentencePieceProcessor of the serialized model `spm_model`."""
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=spm_model)


def _train_to_copy(model: Any, tokenizer: Any, steps: int, seed: int) -> None:
    """`steps` Adam steps teaching `model` `[source language] word </s>` -> `</s> [target
    language] word </s>` (the tokenizer's src_lang and tgt_lang), the `<pad>` row at zero."""
    import torch

    def zero_pad_row() -> None:
        with torch.no_grad():
            model.model.shared.weight[1].zero_()

    train_to_copy(model, tokenizer, steps, seed, zero_pad_row)
