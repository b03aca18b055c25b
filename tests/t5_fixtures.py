"""Tiny Hugging Face T5 checkpoints built locally (no hub, no download), laid out as
`save_pretrained` leaves a T5 v1.0 or a T5 v1.1 / Flan-T5 checkpoint.

    path = build_t5_dir(tmp_path / "t5", version="1.0")                 # random weights
    path = build_t5_dir(tmp_path / "flan", version="1.1", copy_steps=150)  # outputs vary
    AutoTokenizer.from_pretrained(path); T5ForConditionalGeneration.from_pretrained(path)

The tokenizer is transformers' T5Tokenizer over a SentencePiece Unigram model trained here on
hf_fixtures.synthetic_corpus (its pieces, scores and precompiled normaliser, behind T5's
`<pad>` `</s>` `<unk>`, plus EXTRA_IDS sentinels), saved with `save_pretrained`
(tokenizer.json + tokenizer_config.json); config.json has t5-small's task_specific_params
(TASK_PARAMS). v1.0: ReLU feed-forward, output tied to the shared
embedding and scaled by d_model^-0.5, T5's 32 buckets up to distance 128. v1.1: gated-GELU
feed-forward, a separate lm_head.weight and `tie_word_embeddings: false` in config.json as
Flan-T5's files have them (transformers 5 writes neither itself), 8 buckets up to distance 20,
and heads of d_kv 16 whose 4 x 16 is not d_model (32), as Flan-T5-small's 6 x 64 on 512.
The embedding has EXTRA_ROWS more rows than the tokenizer has ids (t5-small: 32,128 rows,
32,100 ids). With `copy_steps` the model is trained that many steps to copy the first word of
a line, so that its outputs depend on the input, have varied lengths and end with `</s>`.
Needs torch, transformers and sentencepiece (the `train` and `hf` extras).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf_fixtures import SPECIAL_PIECES, synthetic_corpus, train_spm, train_to_copy

EXTRA_IDS = 10
EXTRA_ROWS = 3
N_POSITIONS = 64
# as t5-small's config.json has them (the prefixes that transformers' pipelines add)
TASK_PARAMS = {
    "summarization": {"prefix": "summarize: ", "max_length": 200, "num_beams": 4},
    "translation_en_to_de": {"prefix": "translate English to German: ", "max_length": 300},
    "translation_en_to_fr": {"prefix": "translate English to French: ", "max_length": 300},
}


def t5_vocab(model: bytes) -> tuple[list[tuple[str, float]], bytes]:
    """T5Tokenizer's vocabulary of a SentencePiece model (`<pad>` `</s>` `<unk>`, then its
    normal pieces with their scores) and the model's precompiled character map."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    pieces = [(p.piece, p.score) for p in proto.pieces if p.piece not in SPECIAL_PIECES]
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *pieces]
    return vocab, proto.normalizer_spec.precompiled_charsmap


def build_t5_dir(
    path: str | Path,
    *,
    version: str = "1.0",
    vocab_size: int = 400,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    copy_steps: int = 0,
    initializer_factor: float = 1.0,
    n_positions: int = N_POSITIONS,
) -> Path:
    """Write a tiny T5 checkpoint of `version` "1.0" or "1.1" into `path` (created);
    `initializer_factor` scales T5's initial weights (5.0: logits in the hundreds), and
    `n_positions` goes into config.json (T5 itself has no limit there)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import T5Config, T5ForConditionalGeneration, T5Tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    lines = synthetic_corpus("source", seed=seed) + synthetic_corpus("target", seed=seed)
    vocab, charsmap = t5_vocab(train_spm(lines, vocab_size))
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=EXTRA_IDS, _spm_precompiled_charsmap=charsmap)
    tokenizer.save_pretrained(path)
    v11 = version == "1.1"
    config = T5Config(
        vocab_size=len(tokenizer) + EXTRA_ROWS, d_model=d_model,
        d_kv=2 * d_model // heads if v11 else d_model // heads,
        d_ff=2 * d_model, num_layers=layers, num_heads=heads,
        feed_forward_proj="gated-gelu" if v11 else "relu", tie_word_embeddings=not v11,
        relative_attention_num_buckets=8 if v11 else 32,
        relative_attention_max_distance=20 if v11 else 128,
        dropout_rate=0.0, decoder_start_token_id=0, initializer_factor=initializer_factor,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(config).eval()
    if v11:  # Flan-T5's own output table (transformers 5 ties it at construction)
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    if copy_steps:
        train_to_copy(model, tokenizer, copy_steps, seed, lambda: None)
    model.save_pretrained(path)
    config_json: dict[str, Any] = json.loads((path / "config.json").read_text())
    config_json["n_positions"] = n_positions  # as t5-small's config.json has it (512)
    config_json["task_specific_params"] = TASK_PARAMS
    if v11:
        del config_json["scale_decoder_outputs"]
        config_json["tie_word_embeddings"] = False
        state = load_file(str(path / "model.safetensors"))
        state["lm_head.weight"] = model.lm_head.weight.detach().clone().contiguous()
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config_json, indent=2))
    return path
