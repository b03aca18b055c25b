"""Tiny Hugging Face BART and mBART-50 checkpoints, built locally (no hub, no download), laid
out as `save_pretrained` leaves facebook/bart-* and facebook/mbart-large-50-* checkpoints.

    path = build_bart_dir(tmp_path / "bart", copy_steps=200)       # byte-level BPE, post-norm
    path = build_mbart50_dir(tmp_path / "mbart", copy_steps=200)   # Unigram, pre-norm, languages
    BartForConditionalGeneration.from_pretrained(path); AutoTokenizer.from_pretrained(path)

BART: a byte-level BPE trained here with `tokenizers` on hf_fixtures.synthetic_corpus (`<s>`
`<pad>` `</s>` `<unk>` `<mask>` first, fairseq's order), saved by BartTokenizer; a
BartForConditionalGeneration (post-norm, layernorm_embedding, learned positions with offset 2,
unscaled embeddings, decoder start `</s>`, no forced `<s>`). mBART-50: a SentencePiece unigram
model trained here, converted and saved by MBart50Tokenizer (its 52 language codes after the
pieces, `<mask>` last); an MBartForConditionalGeneration (pre-norm with final layer norms,
layernorm_embedding, scaled embeddings, decoder start `</s>`, target language forced first).
Norm weights and final_logits_bias are random, so a map that drops one fails parity.
With `copy_steps` each model is trained that many steps (~5 s for 200 on 2 cores) to copy the
first word of a line (mBART-50: after the target language TARGET), so that outputs depend on
the input, have varied lengths and end with `</s>`.
Needs torch, transformers, tokenizers and sentencepiece (the `train` and `hf` extras).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf_fixtures import synthetic_corpus, train_spm, train_to_copy

SOURCE, TARGET = "en_XX", "fr_XX"  # mBART-50's default languages; the copy model's target
BART_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def _config_fields(vocab_size: int, d_model: int, layers: int, heads: int) -> dict[str, Any]:
    """The BART-family config.json fields both fixtures share (fairseq ids, no dropout)."""
    return dict(
        vocab_size=vocab_size, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model, max_position_embeddings=64,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        forced_eos_token_id=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )  # fmt: skip


def _finish(
    model: Any, targets: Any, path: Path, seed: int, copy_steps: int, **generation: Any
) -> Path:
    """Give `model` weights of a trained model's scale (embeddings N(0, 1/D) with the pad row
    zero, every LayerNorm's weight and bias and final_logits_bias random), train it
    `copy_steps` steps to copy words (`targets`: the tokenizer train_to_copy calls), give it
    a generation config with `generation` and save it into `path`."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    table = model.model.shared.weight
    with torch.no_grad():
        table.normal_(0.0, model.config.d_model**-0.5)
        table[1].zero_()
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
        model.final_logits_bias.normal_(0.0, 0.5)

    def zero_pad_row() -> None:
        with torch.no_grad():
            table[1].zero_()

    if copy_steps:
        train_to_copy(model, targets, copy_steps, seed, zero_pad_row)
    model.generation_config = GenerationConfig(
        bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
        forced_eos_token_id=2, max_length=64, **generation,
    )  # fmt: skip
    model.save_pretrained(path)
    return path


def build_bart_dir(
    path: str | Path,
    *,
    vocab_size: int = 500,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    copy_steps: int = 0,
) -> Path:
    """Write a tiny BART checkpoint into `path` (created) and return it."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        BartTokenizer,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    trained = ByteLevelBPETokenizer()
    lines = synthetic_corpus("source", seed=seed) + synthetic_corpus("target", seed=seed)
    trained.train_from_iterator(
        lines, vocab_size=vocab_size, special_tokens=list(BART_SPECIALS), show_progress=False
    )
    merges = [
        tuple(pair.split(" ")) if isinstance(pair, str) else tuple(pair)
        for pair in json.loads(trained.to_str())["model"]["merges"]
    ]
    tokenizer = BartTokenizer(vocab=trained.get_vocab(), merges=merges)
    tokenizer.save_pretrained(path)
    config = BartConfig(
        **_config_fields(len(tokenizer), d_model, layers, heads),
        activation_function="gelu", scale_embedding=False, forced_bos_token_id=None,
        init_std=0.2,  # post-norm BART learns to copy in 200 steps from this init, not 0.02
    )  # fmt: skip
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(config).eval()
    return _finish(model, _NoBosTargets(tokenizer), path, seed, copy_steps)


class _NoBosTargets:
    """BartTokenizer with labels `word </s>` (no leading `<s>`), so that the copy model does
    not learn to emit `<s>` first (what forced_bos_token_id 0 does, which edgeseq refuses)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.pad_token_id = tokenizer, tokenizer.pad_token_id

    def __call__(self, texts: list[str], **kwargs: Any) -> Any:
        encoded = self.tokenizer(texts, **kwargs)
        encoded["labels"] = encoded["labels"][:, 1:].contiguous()
        return encoded


def build_mbart50_dir(
    path: str | Path,
    *,
    vocab_size: int = 400,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    copy_steps: int = 0,
) -> Path:
    """Write a tiny mBART-50 checkpoint into `path` (created) and return it."""
    import torch
    from transformers import (
        MBart50Tokenizer,
        MBartConfig,
        MBartForConditionalGeneration,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    lines = synthetic_corpus("source", seed=seed) + synthetic_corpus("target", seed=seed)
    spm_dir = path / "spm"
    spm_dir.mkdir(exist_ok=True)
    (spm_dir / "sentencepiece.bpe.model").write_bytes(train_spm(lines, vocab_size))
    tokenizer = MBart50Tokenizer.from_pretrained(str(spm_dir), src_lang=SOURCE, tgt_lang=TARGET)
    (spm_dir / "sentencepiece.bpe.model").unlink()
    spm_dir.rmdir()
    tokenizer.save_pretrained(path)
    config = MBartConfig(
        **_config_fields(len(tokenizer), d_model, layers, heads),
        activation_function="gelu", scale_embedding=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = MBartForConditionalGeneration(config).eval()
    forced = tokenizer.convert_tokens_to_ids(TARGET)
    return _finish(model, tokenizer, path, seed, copy_steps, forced_bos_token_id=forced)
