"""Checkpoints of the real models' exact architecture configs with random weights (issue 55,
"Real shapes as tests"): NLLB-200-distilled-600M, M2M-100-418M, mBART-large-50, T5-base and
Flan-T5-base, laid out as `save_pretrained` leaves them.

    path = build_shape("t5-base", tmp_path / "t5-base")    # SHAPES' names
    megabytes = checkpoint_mb(path)

Each is built in three steps, none holding the model twice at its full vocabulary: the
family's fixture builder (tests/m2m_fixtures.py, mbart_fixtures.py, t5_fixtures.py) writes a
tiny checkpoint with its tokenizer (trained here, a few hundred pieces); the model is then
built anew at the real config (SHAPES: width, heads, layers, feed-forward, positions,
activation, tying) with the tokenizer's row count, its weights drawn by transformers' init and
then given the fixture's scales (the embedding N(0, 1/d_model) with the pad row zero; mBART's
LayerNorms and final_logits_bias random as the fixture has them); last,
test_families_realistic.pad_vocabulary appends random rows up to the real row count (rows no
token maps, as NLLB-200's and t5-base's files have some). The peak RSS while building was 4.4 GB
for NLLB-200-600M's 2.46 GB checkpoint (one thread: 8 min on a busy 2-core machine).

Needs torch, transformers, safetensors and sentencepiece (the `train` and `hf` extras).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The fields of each real model's config.json that fix its architecture (from the published
# files); `rows` is vocab_size, which pad_vocabulary writes last.
BART_FAMILY = {
    "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
    "encoder_attention_heads": 16, "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "max_position_embeddings": 1024,
    "scale_embedding": True, "tie_word_embeddings": True,
}  # fmt: skip
T5_BASE = {
    "d_model": 768, "d_kv": 64, "num_heads": 12, "num_layers": 12, "num_decoder_layers": 12,
    "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
    "layer_norm_epsilon": 1e-6,
}  # fmt: skip


@dataclass(frozen=True)
class Shape:
    """One real model: its family's fixture builder, the config fields it overrides, the
    vocabulary rows of the published checkpoint, and the name of the model it stands for."""

    model: str
    family: str  # "m2m_100" (NLLB layout), "m2m_100-spm" (M2M100Tokenizer), "mbart-50", "t5"
    config: dict[str, Any]
    rows: int
    extra: dict[str, Any] = field(default_factory=dict)  # fixture builder arguments


SHAPES: dict[str, Shape] = {
    "nllb-200-distilled-600m": Shape(
        "facebook/nllb-200-distilled-600M", "m2m_100",
        BART_FAMILY | {"activation_function": "relu"}, 256206,
    ),
    "m2m100-418m": Shape(
        "facebook/m2m100_418M", "m2m_100",
        BART_FAMILY | {"activation_function": "relu"}, 128112, {"layout": "m2m100"},
    ),
    "mbart-large-50": Shape(
        "facebook/mbart-large-50-many-to-many-mmt", "mbart-50",
        BART_FAMILY | {"activation_function": "gelu"}, 250054,
    ),
    "t5-base": Shape(
        "google-t5/t5-base", "t5",
        T5_BASE | {"d_ff": 3072, "feed_forward_proj": "relu", "tie_word_embeddings": True},
        32128, {"version": "1.0"},
    ),
    "flan-t5-base": Shape(
        "google/flan-t5-base", "t5",
        T5_BASE | {"d_ff": 2048, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
        32128, {"version": "1.1"},
    ),
}  # fmt: skip
N_POSITIONS = 512  # t5-base's and flan-t5-base's config.json
GENERATION_MAX_LENGTH = 200  # the BART-family checkpoints' generation_config.json


def build_shape(name: str, path: Path) -> Path:
    """Write the checkpoint of SHAPES[name] into `path` (created) and return it."""
    from test_families_realistic import pad_vocabulary

    shape = SHAPES[name]
    path = Path(path)
    _TINY[shape.family](path, shape)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    _REBUILD[shape.family](path, config | shape.config)
    pad_vocabulary(path, shape.rows)
    return path


def checkpoint_mb(path: Path) -> float:
    """Megabytes (1e6 bytes) of the checkpoint's weights file(s)."""
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e6


def _tiny_m2m(path: Path, shape: Shape) -> None:
    from m2m_fixtures import build_m2m_dir

    build_m2m_dir(path, max_positions=shape.config["max_position_embeddings"], **shape.extra)


def _tiny_mbart(path: Path, shape: Shape) -> None:
    from mbart_fixtures import build_mbart50_dir

    build_mbart50_dir(path, **shape.extra)


def _tiny_t5(path: Path, shape: Shape) -> None:
    from t5_fixtures import build_t5_dir

    build_t5_dir(path, n_positions=N_POSITIONS, **shape.extra)


def _bart_family(path: Path, config: dict[str, Any]) -> None:
    """The M2M-100 or mBART model of `config` (its tokenizer's rows) with the fixture's scales,
    saved over the tiny one; generation_config's max_length as the real files have it."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    hf_config = AutoConfig.for_model(**config)
    model = AutoModelForSeq2SeqLM.from_config(hf_config).eval()
    d_model = hf_config.d_model
    with torch.no_grad():  # a trained model's scale for the table, the pad row zero
        model.model.shared.weight.normal_(0.0, d_model**-0.5)
        model.model.shared.weight[hf_config.pad_token_id].zero_()
        if hf_config.model_type == "mbart":  # as mbart_fixtures._finish: a dropped norm fails
            for module in model.modules():
                if isinstance(module, torch.nn.LayerNorm):
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.normal_(0.0, 0.1)
            model.final_logits_bias.normal_(0.0, 0.5)
    generation = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
    model.save_pretrained(path)
    generation["max_length"] = GENERATION_MAX_LENGTH
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _t5(path: Path, config: dict[str, Any]) -> None:
    """The T5 model of `config` (transformers' init, as t5_fixtures builds it), saved over the
    tiny one with its config.json as t5-base's / flan-t5-base's (n_positions, task prefixes,
    and for v1.1 an lm_head.weight of its own with `tie_word_embeddings: false`)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import T5Config, T5ForConditionalGeneration

    saved = {key: config[key] for key in ("n_positions", "task_specific_params")}
    config = {k: v for k, v in config.items() if k not in ("scale_decoder_outputs", "n_positions")}
    untied = not config["tie_word_embeddings"]
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(**config)).eval()
    if untied:  # Flan-T5's own output table (transformers 5 ties it at construction)
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    model.save_pretrained(path)
    del model
    written = json.loads((path / "config.json").read_text(encoding="utf-8")) | saved
    if untied:
        written.pop("scale_decoder_outputs", None)
        written["tie_word_embeddings"] = False
        state = load_file(str(path / "model.safetensors"))
        if "lm_head.weight" not in state:
            state["lm_head.weight"] = state["shared.weight"].clone()
            save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(written, indent=2))


_TINY: dict[str, Callable[[Path, Shape], None]] = {
    "m2m_100": _tiny_m2m, "mbart-50": _tiny_mbart, "t5": _tiny_t5,
}  # fmt: skip
_REBUILD: dict[str, Callable[[Path, dict[str, Any]], None]] = {
    "m2m_100": _bart_family, "mbart-50": _bart_family, "t5": _t5,
}  # fmt: skip
