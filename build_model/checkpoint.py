"""Checkpoints: a directory of safetensors and JSON files, no pickles.

    save_checkpoint(out / "last", model, tokenizers, task.describe(), state, optimizer)
    model, tokenizers, meta = load_checkpoint(out / "last")   # meta.task, meta.train_state
    restore_training(out / "last", optimizer)                 # Adam moments + torch RNG
    average_checkpoints([run / "epochs/35", run / "epochs/36"], "runs/avg")  # mean weights

Layout of a checkpoint directory:

    model.safetensors          weights (the tied output matrix is stored once); float32, or
                               float16 for a shipped average (loaded back as float32)
    config.json                ModelConfig, indent=2 sort_keys
    tokenizer.json             source tokenizer [+ tokenizer.target.json when not shared]
    tokenizer_config.json      special tokens for transformers (PreTrainedTokenizerFast)
    task.json                  {"name": "g2p", "options": {"stress": true}, "format": 1}
    train_state.json           step, epoch, best metric, recipe, seed, optimizer hyper-parameters
    train_state.safetensors    optional: Adam moments ("optimizer.<param>.<key>") and the torch
                               RNG state ("rng.torch"), needed only to resume training

A checkpoint is written to a hidden temporary sibling directory and renamed into place, so a
killed process never leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from edgeseq.runtime.atomic import atomic_directory
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.constants import CONFIG_FILE, TOKENIZER_FILE
from edgeseq.runtime.errors import CheckpointError, ConfigError, EdgeseqError
from edgeseq.runtime.tokenizer import TokenizerPair

from .kinds import Model, build_transformer
from .model import Seq2SeqTransformer

CHECKPOINT_FORMAT = 1
MODEL_FILE = "model.safetensors"
TASK_FILE = "task.json"
TRAIN_STATE_FILE = "train_state.json"
TRAIN_TENSORS_FILE = "train_state.safetensors"
WEIGHT_DTYPES = {"float32": torch.float32, "float16": torch.float16}
REQUIRED_FILES = (MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE, TASK_FILE, TRAIN_STATE_FILE)


@dataclasses.dataclass
class CheckpointMeta:
    """What a checkpoint says besides the weights."""

    path: Path
    task: dict[str, Any]  # {"name": ..., "options": {...}}: load_task(name, **options)
    train_state: dict[str, Any]  # step, epoch, best, recipe, seed, finished, ...

    @property
    def resumable(self) -> bool:
        """True when the optimizer state needed by `restore_training` is present."""
        return (self.path / TRAIN_TENSORS_FILE).is_file()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
    """Flatten an optimizer's state into named tensors plus its JSON-able param groups."""
    state = optimizer.state_dict()
    tensors = {
        f"optimizer.{index}.{key}": value.detach().clone().contiguous()
        for index, per_param in state["state"].items()
        for key, value in per_param.items()
        if isinstance(value, torch.Tensor)
    }
    tensors["rng.torch"] = torch.get_rng_state()
    return tensors, state["param_groups"]


def save_checkpoint(
    path: str | Path,
    model: Seq2SeqTransformer,
    tokenizers: TokenizerPair,
    task: dict[str, Any],
    train_state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    weights_dtype: str = "float32",
) -> Path:
    """Write a checkpoint directory at `path` (replacing one there); return the path.

    `task` is `Task.describe()`; `train_state` is any JSON-able dict. With `optimizer`, its
    state and the torch RNG state are saved too, so `restore_training` can resume exactly.
    `weights_dtype` "float16" stores the weights at half the size (`load_checkpoint` reads them
    back into a float32 model); it is for shipped checkpoints, not for resuming training."""
    path = Path(path)
    if weights_dtype not in WEIGHT_DTYPES:
        raise ConfigError(f"weights dtype must be one of {', '.join(WEIGHT_DTYPES)}")
    state = dict(train_state, format=CHECKPOINT_FORMAT)
    if weights_dtype != "float32":
        model = copy.deepcopy(model).to(WEIGHT_DTYPES[weights_dtype])
        state["weights_dtype"] = weights_dtype
    with atomic_directory(path) as tmp:
        save_model(model, str(tmp / MODEL_FILE), metadata={"format": str(CHECKPOINT_FORMAT)})
        model.cfg.save(tmp / CONFIG_FILE)
        tokenizers.save(tmp, model.cfg.max_len)
        _write_json(tmp / TASK_FILE, dict(task, format=CHECKPOINT_FORMAT))
        if optimizer is not None:
            tensors, groups = optimizer_tensors(optimizer)
            save_file(tensors, str(tmp / TRAIN_TENSORS_FILE))
            state["optimizer_param_groups"] = groups
        _write_json(tmp / TRAIN_STATE_FILE, state)
    return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def read_meta(path: str | Path) -> CheckpointMeta:
    """Check that `path` is a complete checkpoint and read its task and train state."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} does not exist; pass a directory written by `edgeseq train` "
            "(e.g. runs/NAME/best)"
        )
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is incomplete: missing {', '.join(missing)}; "
            "use another checkpoint (e.g. the run's `last`) or retrain"
        )
    task = _read_json(path / TASK_FILE)
    if not isinstance(task.get("name"), str) or not isinstance(task.get("options", {}), dict):
        raise CheckpointError(f"{path / TASK_FILE} needs a task name and an options object")
    task = {"name": task["name"], "options": task.get("options", {})}
    return CheckpointMeta(path, task, _read_json(path / TRAIN_STATE_FILE))


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[Model, TokenizerPair, CheckpointMeta]:
    """Load a checkpoint: the model of its architecture (in eval mode, on `device`), its
    tokenizers and metadata."""
    meta = read_meta(path)
    path = meta.path
    try:
        cfg = ModelConfig.load(path / CONFIG_FILE)
        tokenizers = TokenizerPair.load(path)
    except EdgeseqError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc}") from None
    sizes = (tokenizers.source.vocab_size, tokenizers.target.vocab_size)
    if sizes != (cfg.src_vocab_size, cfg.tgt_vocab_size):
        raise CheckpointError(
            f"checkpoint {path}: tokenizer vocabularies {sizes} do not match config.json "
            f"({cfg.src_vocab_size}, {cfg.tgt_vocab_size}); the directory mixes two runs"
        )
    model = build_transformer(cfg)
    try:
        load_model(model, path / MODEL_FILE, device=str(device))
    except Exception as exc:  # safetensors raises RuntimeError or its own SafetensorError
        raise CheckpointError(f"checkpoint {path}: weights do not fit config.json: {exc}") from None
    return model.to(device).eval(), tokenizers, meta


def restore_training(path: str | Path, optimizer: torch.optim.Optimizer) -> None:
    """Load the optimizer state and the torch RNG state saved with a checkpoint."""
    meta = read_meta(path)
    if not meta.resumable or "optimizer_param_groups" not in meta.train_state:
        raise CheckpointError(
            f"checkpoint {meta.path} has no optimizer state ({TRAIN_TENSORS_FILE}); "
            "resume from the run's `last` checkpoint"
        )
    tensors = load_file(str(meta.path / TRAIN_TENSORS_FILE))
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            per_param.setdefault(int(index), {})[key] = value
    groups = meta.train_state["optimizer_param_groups"]
    try:
        optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(
            f"checkpoint {meta.path}: optimizer state does not fit: {exc}"
        ) from None
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"])


def _refuse_to_replace(out: Path) -> None:
    """ConfigError unless `out` is absent, empty, or an earlier `average`/`grow` result
    (which is replaced): a run directory or any other content is never overwritten."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    state_file = out / TRAIN_STATE_FILE
    if out.is_dir() and state_file.is_file() and not (out / TRAIN_TENSORS_FILE).exists():
        try:
            state = _read_json(state_file)
        except CheckpointError:
            state = {}
        if "averaged_from" in state or "grown_from" in state:
            return
    raise ConfigError(
        f"--out {out} exists and is not an earlier `edgeseq average` or `grow` result; "
        "choose a new directory (nothing was written)"
    )


def average_checkpoints(
    paths: list[str | Path], out: str | Path, weights_dtype: str = "float32"
) -> Path:
    """Write to `out` a checkpoint whose weights are the element-wise mean of those at `paths`
    (checkpoint averaging, as in "Attention is all you need"); return `out`.

    The mean is taken in float64 and stored as `weights_dtype` ("float32" or "float16"). With
    one checkpoint the result is its weights alone, without optimizer state: with "float16",
    a half-size copy for shipping.

    The checkpoints must share config (dropout aside), tokenizers and task; the first one's
    config, tokenizers and task are kept. No optimizer state is written: the result is for
    evaluation and export, or for `edgeseq train --init-from`."""
    if not paths:
        raise ConfigError("averaging needs at least one checkpoint")
    out = Path(out)
    if out.resolve() in {Path(p).resolve() for p in paths}:
        raise ConfigError(f"--out {out} is one of the inputs; choose another directory")
    _refuse_to_replace(out)
    first, tokenizers, meta = load_checkpoint(paths[0])
    total = {k: v.double() for k, v in first.state_dict().items()}
    reference = dict(first.cfg.__dict__, dropout=None)
    for path in paths[1:]:
        model, other, other_meta = load_checkpoint(path)
        if dict(model.cfg.__dict__, dropout=None) != reference:
            raise CheckpointError(
                f"{path} has another model config than {paths[0]}; average one run's checkpoints"
            )
        same_vocab = [t.to_str() for t in (other.source, other.target)] == [
            t.to_str() for t in (tokenizers.source, tokenizers.target)
        ]
        if not same_vocab or other_meta.task != meta.task:
            raise CheckpointError(f"{path} has other tokenizers or task than {paths[0]}")
        for name, value in model.state_dict().items():
            total[name] += value.double()
    first.load_state_dict({k: (v / len(paths)).float() for k, v in total.items()})
    steps = [read_meta(p).train_state.get("step") for p in paths]
    state = {"averaged_from": [str(p) for p in paths], "averaged_steps": steps}
    state["step"] = max((s for s in steps if isinstance(s, int)), default=None)
    return save_checkpoint(out, first, tokenizers, meta.task, state, weights_dtype=weights_dtype)


def widen(
    trained: torch.Tensor, shape: torch.Size, name: str, generator: torch.Generator
) -> torch.Tensor:
    """`trained` grown to `shape` along the FFN's hidden axis (the only axis that grows):
    `ffn.w_1.weight` (d_ff, D) new rows ~ N(0, std of the trained matrix), `ffn.w_1.bias`
    (d_ff,) new zeros, `ffn.w_2.weight` (D, d_ff) new zero columns; anything else is copied."""
    if trained.shape == shape:
        return trained.clone()
    if name.endswith("ffn.w_1.weight"):
        extra = shape[0] - trained.shape[0]
        new = torch.randn(extra, trained.shape[1], generator=generator) * trained.float().std()
        return torch.cat([trained, new.to(trained.dtype)], dim=0)
    if name.endswith("ffn.w_1.bias"):
        return torch.cat([trained, trained.new_zeros(shape[0] - trained.shape[0])])
    if name.endswith("ffn.w_2.weight"):
        return torch.cat([trained, trained.new_zeros(shape[0], shape[1] - trained.shape[1])], 1)
    raise ConfigError(f"cannot grow {name} from {tuple(trained.shape)} to {tuple(shape)}")


def stacked_layer_map(n_old: int, n_new: int) -> list[int]:
    """For each of `n_new` layers, the index of the trained layer it starts as.

    Each trained layer is repeated in place, lower layers first when `n_new` is not a multiple
    of `n_old`: 3 -> 6 gives [0, 0, 1, 1, 2, 2], 3 -> 4 gives [0, 0, 1, 2]."""
    if n_new < n_old:
        raise ConfigError(f"growing cannot drop layers ({n_old} -> {n_new})")
    return [k * n_old // n_new for k in range(n_new)]


def grow_checkpoint(
    path: str | Path,
    out: str | Path,
    n_encoder_layers: int | None = None,
    n_decoder_layers: int | None = None,
    d_ff: int | None = None,
    seed: int = 0,
) -> Path:
    """Write to `out` a deeper and/or wider copy of the checkpoint at `path`; return `out`.

    Deeper, by layer stacking (Gong et al., 2019, "Efficient training of BERT by progressively
    stacking"): each new layer starts as a copy of a trained one (`stacked_layer_map`). The
    copy does not compute the same function (a post-norm layer applied twice is not the
    identity). Wider (`d_ff`), by Net2Net-style widening of every FFN (Chen et al., 2016):
    W₁ (d_ff, D) gets new rows drawn like its trained ones (normal, their std), b₁ zeros,
    W₂ (D, d_ff) zero columns, so the wider FFN computes exactly what the trained one did.
    Embeddings, positional tables and the output layer are kept. The result is a starting
    point for `edgeseq train --init-from` with a recipe of the new shape. No optimizer state
    is written."""
    out = Path(out)
    if out.resolve() == Path(path).resolve():
        raise ConfigError(f"--out {out} is the input checkpoint; choose another directory")
    _refuse_to_replace(out)
    model, tokenizers, meta = load_checkpoint(path)
    old = model.cfg
    if old.architecture != "encoder-decoder":
        raise ConfigError(
            f"growing supports encoder-decoder checkpoints; {path} is {old.architecture}"
        )
    n_encoder_layers = n_encoder_layers or old.n_encoder_layers
    n_decoder_layers = n_decoder_layers or old.n_decoder_layers
    d_ff = d_ff or old.d_ff
    if d_ff < old.d_ff:
        raise ConfigError(f"growing cannot narrow the FFN ({old.d_ff} -> {d_ff})")
    cfg = dataclasses.replace(
        old, n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers, d_ff=d_ff
    )
    if cfg == old:
        raise ConfigError("nothing to grow: give more layers or a larger --d-ff")
    maps = {
        "encoder_layers.": stacked_layer_map(old.n_encoder_layers, n_encoder_layers),
        "decoder_layers.": stacked_layer_map(old.n_decoder_layers, n_decoder_layers),
    }
    trained = model.state_dict()
    grown = Seq2SeqTransformer(cfg.validate())
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, target in grown.state_dict().items():
        source = name
        for prefix, mapping in maps.items():
            if name.startswith(prefix):
                index, rest = name[len(prefix) :].split(".", 1)
                source = f"{prefix}{mapping[int(index)]}.{rest}"
        weights[name] = widen(trained[source], target.shape, name, generator)
    grown.load_state_dict(weights)
    state = {
        "grown_from": str(path),
        "grown_layers": {"encoder": maps["encoder_layers."], "decoder": maps["decoder_layers."]},
        "grown_d_ff": [old.d_ff, d_ff],
        "step": meta.train_state.get("step"),
    }
    return save_checkpoint(out, grown, tokenizers, meta.task, state)
