"""Tiny Hugging Face MarianMT checkpoints built locally (no hub, no download), laid out as
`transformers`' Marian conversion script leaves a converted OPUS-MT model.

    path = build_marian_dir(tmp_path / "marian")                      # one vocabulary, one spm
    path = build_marian_dir(tmp_path / "en-de", shared_spm=False)     # opus-mt-en-de's layout
    path = build_marian_dir(tmp_path / "sep", shared_vocab=False)     # separate vocabularies
    path = build_marian_dir(tmp_path / "copy", copy_steps=150)        # outputs vary, end in </s>
    MarianTokenizer.from_pretrained(path); MarianMTModel.from_pretrained(path)

The directory holds `source.spm`, `target.spm` (SentencePiece unigram models trained here on a
synthetic corpus with accents, digits and punctuation), `vocab.json` (and
`target_vocab.json` when the vocabularies are separate), `tokenizer_config.json` as
`MarianTokenizer.save_pretrained` writes it, and `config.json`, `generation_config.json` and
`model.safetensors` of a `MarianMTModel` with random weights. A random Marian repeats one
piece up to `max_len` whatever its input; with `copy_steps` the model is first trained that
many steps (~5 s for 150) to copy single words, so that its outputs depend on the input, have
varied lengths and end with `</s>`: what a check comparing two engines' outputs needs.

`vocab.json` follows Marian's order, not SentencePiece's: `</s>` 0, `<unk>` 1, the pieces (here
in a seeded random order, with the language codes `>>xx<<` of LANGUAGE_CODES among them, as
multilingual OPUS-MT models have them), `<pad>` last. The pad id is the decoder start.
Needs torch, transformers and sentencepiece (the `train` and `hf` extras).
"""

from __future__ import annotations

import io
import json
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Language codes placed in vocab.json (not in the SentencePiece models, like OPUS-MT's).
LANGUAGE_CODES = (">>deu<<", ">>fra<<", ">>spa<<", ">>zho_Hans<<")
# Syllables of two made-up languages (the source and the target corpus), punctuation, and
# words of both: every ASCII letter, as every real SentencePiece vocabulary has them.
SYLLABLES = {
    "source": "the an ing or es st re qu ch ou é è à ç ô ï ka lo mi ber ton ship ly ness",
    "target": "der die ung sch ei ß ä ö ü en er zu ge ber ch st ñ á í ó ú ll rr ção ão",
}
PUNCTUATION = ". , ! ? ; : -- 's ... \" ( ) % € / < > ->"
COMMON_WORDS = (
    "λόγος καλή мир привет Straße naïve façade œuvre The quick brown fox jumps over the lazy"
    " dog. Pack my box with five dozen liquor jugs."
)
SPECIAL_PIECES = ("<unk>", "<s>", "</s>")  # SentencePiece's control pieces, not vocab entries
# OPUS-MT's generation_config.json besides the token ids (max_length: this model's positions).
GENERATION = {"forced_eos_token_id": 0, "bad_words_ids": [["<pad>"]], "max_length": 64}
GENERATION |= {"num_beams": 4}


def synthetic_corpus(language: str, n_lines: int = 3000, seed: int = 0) -> list[str]:
    """`n_lines` sentences of made-up words of `language` ("source" or "target"), with
    capitals, digits, punctuation and a little Greek and Cyrillic."""
    rng = random.Random(f"{language}-{seed}")
    syllables = SYLLABLES[language].split()
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(600)]
    words += COMMON_WORDS.split()
    lines = []
    for _ in range(n_lines):
        tokens = rng.choices(words, k=rng.randint(2, 14))
        if rng.random() < 0.4:
            tokens.insert(rng.randrange(len(tokens) + 1), str(rng.randint(0, 99999)))
        if rng.random() < 0.3:
            i = rng.randrange(len(tokens))
            tokens[i] += rng.choice(PUNCTUATION.split())
        line = " ".join(tokens)
        if rng.random() < 0.6:
            line = line[0].upper() + line[1:]
        lines.append(line + rng.choice((".", "!", "?", "")))
    return lines


def train_spm(lines: list[str], vocab_size: int) -> bytes:
    """A SentencePiece unigram model (default nmt_nfkc normalisation) trained on `lines`."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def spm_pieces(model: bytes) -> list[str]:
    """The normal pieces of a SentencePiece model, in its id order (control pieces left out)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    return [p for p in pieces if p not in SPECIAL_PIECES]


def marian_vocab(pieces: list[str], codes: tuple[str, ...], size: int, seed: int) -> dict[str, int]:
    """Marian's vocab.json: `</s>` 0, `<unk>` 1, `pieces` and `codes` in a seeded order, then
    filler entries up to `size - 1` entries (Marian vocabularies of one model have one size),
    `<pad>` last."""
    rng = random.Random(seed)
    body = list(dict.fromkeys([*pieces, *codes]))
    rng.shuffle(body)
    entries = ["</s>", "<unk>", *body]
    entries += [f"▁unused{i}" for i in range(size - 1 - len(entries))]
    entries.append("<pad>")
    return {token: i for i, token in enumerate(entries)}


def build_marian_dir(
    path: str | Path,
    *,
    vocab_size: int = 400,
    d_model: int = 32,
    layers: int = 2,
    seed: int = 0,
    shared_vocab: bool = True,
    shared_spm: bool | None = None,
    codes: tuple[str, ...] = LANGUAGE_CODES,
    copy_steps: int = 0,
    generation: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random MarianMT checkpoint into `path` (created) and return it.

    `vocab_size`: pieces per SentencePiece model; `shared_vocab`: one vocab.json for both sides
    (else vocab.json and target_vocab.json, untied encoder/decoder embeddings); `shared_spm`:
    one SentencePiece model for both sides (default: `shared_vocab`); `copy_steps`: train the
    random model that many steps to copy single words (see the module docstring);
    `generation`: generation_config.json's settings besides the token ids (default OPUS-MT's:
    GENERATION)."""
    from transformers import MarianTokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shared_spm = shared_vocab if shared_spm is None else shared_spm
    source_spm = train_spm(synthetic_corpus("source", seed=seed), vocab_size)
    target_spm = (
        source_spm if shared_spm else train_spm(synthetic_corpus("target", seed=seed), vocab_size)
    )
    raw = path / "raw"
    raw.mkdir(exist_ok=True)
    (raw / "source.spm").write_bytes(source_spm)
    (raw / "target.spm").write_bytes(target_spm)
    source_pieces, target_pieces = spm_pieces(source_spm), spm_pieces(target_spm)
    files = {"source_spm": str(raw / "source.spm"), "target_spm": str(raw / "target.spm")}
    if shared_vocab:
        pieces = source_pieces + target_pieces
        vocab = marian_vocab(pieces, codes, len(set(pieces)) + len(codes) + 3, seed)
        _write_json(raw / "vocab.json", vocab)
        files["vocab"] = str(raw / "vocab.json")
    else:
        size = max(len(source_pieces), len(target_pieces)) + len(codes) + 3
        _write_json(raw / "vocab.json", marian_vocab(source_pieces, codes, size, seed))
        _write_json(raw / "target_vocab.json", marian_vocab(target_pieces, codes, size, seed + 1))
        files |= {
            "vocab": str(raw / "vocab.json"),
            "target_vocab_file": str(raw / "target_vocab.json"),
        }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        tokenizer = MarianTokenizer(**files, separate_vocabs=not shared_vocab)
    tokenizer.save_pretrained(path)
    for name in ("source.spm", "target.spm", "vocab.json", "target_vocab.json"):
        (raw / name).unlink(missing_ok=True)
    raw.rmdir()
    model = _random_model(len(tokenizer.encoder), d_model, layers, seed, shared_vocab)
    if copy_steps:
        _train_to_copy(model, tokenizer, copy_steps, seed)
    model.generation_config = _generation_config(len(tokenizer.encoder) - 1, generation)
    model.save_pretrained(path)
    return path


def _random_model(vocab_size: int, d_model: int, layers: int, seed: int, shared_vocab: bool) -> Any:
    """A random MarianMTModel shaped like OPUS-MT's (post-norm, swish, scaled embeddings,
    sinusoidal positions, tied output + final_logits_bias), eval mode."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    pad_id = vocab_size - 1
    config = MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        max_position_embeddings=64,
        activation_function="swish",
        scale_embedding=True,
        share_encoder_decoder_embeddings=shared_vocab,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        decoder_start_token_id=pad_id,
        eos_token_id=0,
        forced_eos_token_id=0,
        bos_token_id=0,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        # Random weights of the scale a trained model has, and a non-zero output bias so that
        # an importer that drops it fails parity. The pad row stays zero, as in OPUS-MT.
        for embedding in {id(e): e for e in _embeddings(model)}.values():
            embedding.weight.normal_(0.0, 1.0 / d_model**0.5)
            embedding.weight[pad_id].zero_()
        model.final_logits_bias.normal_(0.0, 0.5)
    return model


def _generation_config(pad_id: int, settings: dict[str, Any] | None) -> Any:
    """The GenerationConfig of a converted OPUS-MT model: the token ids, then `settings`
    (default GENERATION; "<pad>" in bad_words_ids stands for the pad id)."""
    from transformers import GenerationConfig

    settings = dict(GENERATION if settings is None else settings)
    if "bad_words_ids" in settings:
        words = settings["bad_words_ids"]
        settings["bad_words_ids"] = [[pad_id if i == "<pad>" else i for i in w] for w in words]
    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": pad_id}
    return GenerationConfig(**ids, decoder_start_token_id=pad_id, **settings)


def _train_to_copy(model: Any, tokenizer: Any, steps: int, seed: int) -> None:
    """`steps` Adam steps teaching `model` to copy words, Marian's pad rows kept at zero."""
    import torch

    pad_id = tokenizer.pad_token_id
    tables = {id(e): e.weight for e in _embeddings(model)}.values()

    def zero_pad_rows() -> None:
        with torch.no_grad():
            for table in tables:
                table[pad_id].zero_()

    train_to_copy(model, tokenizer, steps, seed, zero_pad_rows)


def train_to_copy(
    model: Any, tokenizer: Any, steps: int, seed: int, after_step: Callable[[], None]
) -> None:
    """`steps` Adam steps (batches of 16 words of the source corpus, 1 torch thread) teaching a
    Hugging Face seq2seq `model` to copy its input; `after_step` runs after each update."""
    import torch

    words = [line.split()[0] for line in synthetic_corpus("source", steps * 16, seed + 1)]
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model.train()
    try:
        for step in range(steps):
            batch = words[step * 16 : (step + 1) * 16]
            encoded = tokenizer(batch, text_target=batch, padding=True, return_tensors="pt")
            encoded["labels"][encoded["labels"] == tokenizer.pad_token_id] = -100
            loss = model(**encoded).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            after_step()
    finally:
        torch.set_num_threads(threads)
        model.eval()


def _embeddings(model) -> list:
    inner = model.model
    return [inner.encoder.embed_tokens, inner.decoder.embed_tokens, model.lm_head]


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
