"""An opus-mt-sized MarianMT checkpoint built locally, and the machine facts `vs_optimum.py`
reports (memory bandwidth, bytes a decoder step reads).

    build_marian(Path("runs/vs-optimum/marian"), OPUS_SIZE)    # ~60 M params, 32k vocabulary
    build_marian(Path("/tmp/tiny-marian"), TINY_SIZE)          # seconds, for the tests
    held_out_sentences(64)                  # source sentences of the same made-up language
    copy_bandwidth()                        # bytes/s of a numpy copy on one core
    decoder_step_bytes(config_json)         # bytes of the weights one greedy step reads

The checkpoint is laid out as `tests/hf_fixtures.py` lays out its tiny ones (the same
SentencePiece training, Marian's vocab.json order, `MarianTokenizer.save_pretrained`), at the
shape of Helsinki-NLP/opus-mt-en-de: d_model 512, 6 + 6 layers, 8 heads, FFN 2048, swish,
scaled embeddings, tied output plus final_logits_bias, max_position_embeddings 512, one
shared vocabulary (here one SentencePiece model of 32,000 pieces trained on a synthetic
corpus with enough distinct words to fill it). The weights are random (seed 0; embeddings of
a trained model's scale), so outputs are noise, and a random decoder never picks `</s>` (or
picks it first), whatever its bias. So `</s>`'s output row is set to make its logit grow with
the position (`shape_eos`: a ridge-regression direction of the position in the last decoder
layer's states, fitted on 16 greedy decodes) and to reach a typical top logit near
`eos_position`: outputs then end at varied lengths around it, as a trained model's do,
instead of running to the length cap. (Training for a minute is what we would rather do: a
step of this model took ~20 s on the loaded 2-core machine.) Needs torch, transformers and
sentencepiece (`train`, `hf` extras).
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hf_fixtures import marian_vocab, spm_pieces, train_spm

LETTERS = "abcdefghijklmnopqrstuvwxyzéèàçôïäöüßñ"
PUNCTUATION = (".", ",", "!", "?", ";", ":", "'s", "%", ")")
EOS = 0  # Marian's </s>
RIDGE = 10.0  # shape_eos's regularisation (held-out R^2 0.999 at d_model 512; 0 overfits)


@dataclass(frozen=True)
class MarianSize:
    """The shape of a built checkpoint."""

    pieces: int  # SentencePiece pieces (vocab.json has 3 more: </s>, <unk>, <pad>)
    d_model: int
    layers: int  # encoder and decoder layers each
    heads: int
    ffn: int
    max_positions: int
    corpus_lines: int  # synthetic sentences the SentencePiece model is trained on
    eos_position: int  # where `</s>`'s logit reaches a typical top logit (shape_eos)
    eos_slope: float  # its growth per position: the spread of lengths is ~1 / slope


OPUS_SIZE = MarianSize(32000, 512, 6, 8, 2048, 512, 40000, eos_position=24, eos_slope=0.08)
TINY_SIZE = MarianSize(400, 32, 2, 4, 64, 512, 2000, eos_position=8, eos_slope=0.1)


def made_up_words(n: int, seed: int) -> list[str]:
    """`n` distinct words of 1-4 syllables over 400 made-up syllables (accented letters too)."""
    rng = random.Random(f"syllables-{seed}")
    syllables = sorted({"".join(rng.choices(LETTERS, k=rng.randint(1, 3))) for _ in range(400)})
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choices(syllables, k=rng.randint(1, 4))))
    return sorted(words)


def sentences(n: int, seed: int, vocabulary_seed: int = 0) -> list[str]:
    """`n` sentences of 3-25 made-up words, some capitalised, with digits and punctuation."""
    words = made_up_words(60000, vocabulary_seed)
    rng = random.Random(f"sentences-{seed}")
    lines = []
    for _ in range(n):
        tokens = rng.choices(words, k=rng.randint(3, 25))
        if rng.random() < 0.3:
            tokens.insert(rng.randrange(len(tokens) + 1), str(rng.randint(0, 99999)))
        if rng.random() < 0.3:
            tokens[rng.randrange(len(tokens))] += rng.choice(PUNCTUATION)
        line = " ".join(tokens)
        lines.append((line[0].upper() + line[1:] if rng.random() < 0.6 else line) + ".")
    return lines


def held_out_sentences(n: int) -> list[str]:
    """`n` distinct sentences the SentencePiece model was not trained on."""
    return list(dict.fromkeys(sentences(n + 16, seed=7)))[:n]


def build_marian(path: Path, size: MarianSize, seed: int = 0) -> Path:
    """Write a random MarianMT checkpoint of `size` into `path` (see the module docstring)."""
    from transformers import MarianTokenizer

    path.mkdir(parents=True, exist_ok=True)
    spm = train_spm(sentences(size.corpus_lines, seed=seed), size.pieces)
    pieces = spm_pieces(spm)
    raw = path / "raw"
    raw.mkdir(exist_ok=True)
    (raw / "source.spm").write_bytes(spm)
    vocab = marian_vocab(pieces, (), len(pieces) + 3, seed)
    import json

    (raw / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        files = {"source_spm": raw / "source.spm", "target_spm": raw / "source.spm"}
        tokenizer = MarianTokenizer(
            **{k: str(v) for k, v in files.items()}, vocab=str(raw / "vocab.json")
        )
    tokenizer.save_pretrained(path)
    for file in raw.iterdir():
        file.unlink()
    raw.rmdir()
    _save_model(path, len(vocab), size, seed)
    return path


def torch_no_grad(function):
    """`function` under torch.no_grad (torch imported when called)."""

    def wrapped(*args, **kwargs):
        import torch

        with torch.no_grad():
            return function(*args, **kwargs)

    return wrapped


def _save_model(path: Path, vocab_size: int, size: MarianSize, seed: int) -> None:
    """A random MarianMTModel of `size` with OPUS-MT's options, saved as safetensors."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    pad = vocab_size - 1
    config = MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=size.d_model,
        encoder_layers=size.layers,
        decoder_layers=size.layers,
        encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads,
        encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn,
        max_position_embeddings=size.max_positions,
        activation_function="swish",
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=EOS,
        forced_eos_token_id=EOS,
        bos_token_id=EOS,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        table = model.model.shared.weight
        table.normal_(0.0, 1.0 / size.d_model**0.5)  # a trained model's scale
        table[pad].zero_()  # as in OPUS-MT: the decoder starts from a zero embedding
        model.final_logits_bias.normal_(0.0, 0.5)
    model.generation_config = GenerationConfig(
        bos_token_id=EOS,
        eos_token_id=EOS,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        forced_eos_token_id=EOS,
        bad_words_ids=[[pad]],
        max_length=size.max_positions,
        num_beams=4,
    )
    shape_eos(model, path, size, seed)
    model.save_pretrained(path)


@torch_no_grad
def shape_eos(
    model, path: Path, size: MarianSize, seed: int, rows: int = 16, steps: int = 64
) -> None:
    """Set `</s>`'s output row and bias (tied: its embedding row too, which only the source's
    final `</s>` reads) so that its logit is about eos_slope * (t - eos_position) + the mean
    top logit at position t (module docstring)."""
    import torch
    from transformers import MarianTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = MarianTokenizer.from_pretrained(path)
    bias = model.final_logits_bias
    bias[0, EOS] = -1e4  # decode without ends
    batch = tokenizer(sentences(rows, seed=seed + 3), return_tensors="pt", padding=True)
    out = model.generate(
        **batch, num_beams=1, max_new_tokens=steps, max_length=None, forced_eos_token_id=None
    )
    forward = model(**batch, decoder_input_ids=out[:, :-1], output_hidden_states=True)
    states = forward.decoder_hidden_states[-1].reshape(-1, size.d_model)  # (B*T, D)
    tops = forward.logits.max(-1).values.mean(0)  # (T,): the mean top logit per position
    top, k = tops[1:].mean(), size.eos_slope
    position = torch.arange(out.shape[1] - 1, dtype=torch.float32)
    # The first step's top logit is far below the others' (its input is the zero pad
    # embedding): aim its </s> logit 5 below it, or every output would be empty.
    position[0] = size.eos_position - (top - tops[0] + 5.0) / k
    position = position.repeat(out.shape[0])
    mean_state, mean_position = states.mean(0), position.mean()
    centred = states - mean_state
    ridge = centred.T @ centred + RIDGE * torch.eye(size.d_model)  # plain least squares overfits
    w = torch.linalg.solve(ridge, centred.T @ (position - mean_position))  # centred @ w ~ position
    model.model.shared.weight[EOS] = k * w
    bias[0, EOS] = top + k * (mean_position - size.eos_position) - k * (mean_state @ w)


def copy_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second moved by `np.copyto` of a `megabytes` float32 array on one core
    (read + write counted, as STREAM's copy does), fastest of `repeats`."""
    source = np.ones(megabytes * 2**20 // 4, dtype=np.float32)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best


def decoder_step_parameters(config: dict) -> dict[str, int]:
    """Parameters one greedy decoder step reads at batch 1, by part: every decoder layer's
    self-attention Q/K/V/O, cross-attention Q and O (its K and V projections of the encoder
    output are computed once per input and cached), FFN and layer norms, and the output
    projection (vocabulary x d_model) with its bias. Caches and activations are left out:
    at batch 1 they are a few hundred KB against ~160 MB of fp32 weights."""
    d, ffn, vocab = config["d_model"], config["decoder_ffn_dim"], config["vocab_size"]
    linear = d * d + d
    per_layer = 4 * linear + 2 * linear + (d * ffn + ffn) + (ffn * d + d) + 3 * 2 * d
    return {
        "decoder layers": config["decoder_layers"] * per_layer,
        "output projection": vocab * d + vocab,
    }
