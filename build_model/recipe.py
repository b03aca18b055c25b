"""A recipe: the model hyper-parameters and training settings of a run, one flat JSON object.

    recipe = Recipe.load("models/recipes/tiny.json")      # ConfigError naming every problem
    cfg = recipe.model_config(src_vocab_size=14, tgt_vocab_size=14)
    recipe.to_dict()                                      # the flat form, stored in checkpoints

Model fields are those of `ModelConfig` except the vocabulary sizes and special ids (they come
from the tokenizers); the training fields are documented on `Recipe`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import ConfigError

MODEL_FIELDS = ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff", "dropout")
MODEL_FIELDS += ("max_len", "positional", "norm", "activation", "tie_output", "layer_norm_eps")
MODEL_FIELDS += ("architecture", "norm_type", "ffn", "relative_buckets", "relative_max_distance")
MODEL_FIELDS += ("head_dim", "embedding_norm")
# Model fields that fix the weights' shapes and meaning; the others may change between calls.
SHAPE_FIELDS = tuple(f for f in MODEL_FIELDS if f != "dropout")
PRECISIONS = ("fp32", "bf16")
SCHEDULES = ("inverse_sqrt", "linear")


@dataclass
class Recipe:
    """Model hyper-parameters plus training settings; a flat JSON object on disk."""

    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields but vocab sizes
    batch_tokens: int = 4000  # padded source + target tokens per batch
    bucket_noise: float = 0.3  # length jitter when bucketing (see tasks.make_batches); 0 = strict
    warmup: int = 4000  # steps of linear learning-rate warm-up
    lr_factor: float = 1.0  # scale of the schedule (peak lr = lr_factor * (d_model * warmup)^-0.5)
    schedule: str = "inverse_sqrt"  # after warm-up: "inverse_sqrt" (the paper's) or "linear" to 0
    epochs: int = 10
    label_smoothing: float = 0.1
    precision: str = "fp32"  # "bf16": autocast matmuls to bfloat16 (weights stay fp32)
    clip: float = 1.0  # max global gradient norm; 0 disables clipping
    eval_max_items: int = 500  # dev sources decoded greedily per evaluation; 0 = all
    eval_loss_max_items: int = 10000  # dev pairs in the dev loss; 0 = all
    eval_batch_size: int = 128  # sources per greedy batch
    save_every: int = 500  # steps between `last` checkpoints
    keep_epochs: int = 0  # weights of the last N finished epochs kept in OUT/epochs/ (averaging)
    log_every: int = 50  # steps between log.jsonl lines
    distill_weight: float = 0.5  # with teachers: loss = (1 - w) * CE + w * KL(teachers || model)
    distill_temperature: float = 1.0  # softmax temperature of the distillation term
    description: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recipe:
        """Split a flat recipe into model and training fields; ConfigError lists every problem."""
        if not isinstance(data, dict):
            raise ConfigError("a recipe must be a JSON object")
        train_names = {f.name for f in fields(cls)} - {"model"}
        unknown = sorted(set(data) - train_names - set(MODEL_FIELDS))
        problems = [f"unknown recipe keys: {', '.join(unknown)}"] if unknown else []
        recipe = cls(
            model={k: v for k, v in data.items() if k in MODEL_FIELDS},
            **{k: v for k, v in data.items() if k in train_names},
        )
        problems += recipe.problems()
        if problems:
            raise ConfigError("invalid recipe: " + "; ".join(problems) + ". Fix the recipe file.")
        return recipe

    @classmethod
    def load(cls, path: str | Path) -> Recipe:
        """Read a recipe JSON file."""
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise ConfigError(f"recipe {path} does not exist; see models/recipes/") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"recipe {path} is not valid JSON: {exc}") from None

    def problems(self) -> list[str]:
        """Every problem with the training fields and the model fields."""
        out = [p for p in self.model_config(100, 100).problems() if "vocab" not in p]
        positive = ("batch_tokens", "warmup", "epochs", "eval_batch_size", "save_every")
        zero_ok = ("log_every", "eval_max_items", "eval_loss_max_items", "keep_epochs")
        for name in (*positive, *zero_ok):
            value = getattr(self, name)
            low = 1 if name in positive or name == "log_every" else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                out.append(f"{name} must be an integer >= {low}, got {value!r}")
        for name, low, high in (
            ("lr_factor", 0, math.inf),
            ("clip", 0, math.inf),
            ("bucket_noise", 0, math.inf),
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not low <= value < high:
                out.append(f"{name} must be a number >= {low}, got {value!r}")
        if self.precision not in PRECISIONS:
            out.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.schedule not in SCHEDULES:
            out.append(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        weight, temperature = self.distill_weight, self.distill_temperature
        if not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
            out.append(f"distill_weight must be in [0, 1], got {weight!r}")
        if not isinstance(temperature, (int, float)) or not temperature > 0:
            out.append(f"distill_temperature must be a number > 0, got {temperature!r}")
        ls = self.label_smoothing
        if not isinstance(ls, (int, float)) or not 0 <= ls < 1:
            out.append(f"label_smoothing must be in [0, 1), got {ls!r}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON form (model fields at the top level)."""
        data = {k: v for k, v in asdict(self).items() if k != "model"}
        return {**self.model, **data}

    def shape(self) -> dict[str, Any]:
        """The model fields that weights depend on (all but dropout), defaults filled in."""
        defaults = asdict(ModelConfig(src_vocab_size=1, tgt_vocab_size=1))
        return {k: self.model.get(k, defaults[k]) for k in SHAPE_FIELDS}

    def model_config(self, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
        """The ModelConfig of this recipe for the given vocabulary sizes (not validated)."""
        return ModelConfig(
            src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, **self.model
        )
