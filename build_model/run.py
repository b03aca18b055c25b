"""Where a training run starts: a new run (from a task, or from a checkpoint's weights with
`--init-from`), or a resumed one (OUT/last, its recipe possibly changed in training fields and
dropout, never in shape). `build_model.train` trains whatever these return.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import CheckpointError, ConfigError
from edgeseq.runtime.tokenizer import TokenizerPair

from .checkpoint import load_checkpoint, read_meta
from .kinds import build_transformer
from .model import Seq2SeqTransformer
from .recipe import Recipe
from .tasks import Task, load_task

# What a checkpoint's train_state.json carries from one train() call to the next.
RUN_STATE_KEYS = ("step", "epoch", "batch_in_epoch", "best", "seed", "finished", "epochs")
RUN_STATE_KEYS += ("teachers",)  # checkpoint paths of a distilling run (build_model.distill)


def refuse_existing_run(out: str | Path) -> None:
    """CheckpointError unless `out` is missing or empty (a new run must not overwrite one)."""
    out = Path(out)
    for name in ("last", "best"):
        if (out / name).exists():
            state = read_meta(out / name).train_state
            kind = "a finished" if state.get("finished") else "an unfinished"
            raise CheckpointError(
                f"{out} already holds {kind} run (step {state.get('step')}); continue it "
                "with --resume (and a larger --epochs) or choose another --out"
            )
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out} exists and is not an edgeseq run; choose another --out")


def new_run(
    task: Task | None, recipe: Recipe, out: Path, seed: int, init_from: Path | None
) -> tuple[Seq2SeqTransformer, TokenizerPair, dict[str, Any], Task]:
    """Refuse an `out` that holds a run; build (or, with `init_from`, load) tokenizers and
    model, and a fresh state."""
    refuse_existing_run(out)
    torch.manual_seed(seed)
    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best": None, "seed": seed}
    if init_from is None:
        if task is None:
            raise ConfigError("a new run needs a task (or --init-from a checkpoint)")
        tokenizers = task.build_tokenizers()
        check_architecture(task, recipe)
        cfg = recipe.model_config(tokenizers.source.vocab_size, tokenizers.target.vocab_size)
        return build_transformer(cfg.validate()), tokenizers, state, task
    model, tokenizers, meta = load_checkpoint(init_from)
    if task is not None and task.describe() != meta.task:
        raise ConfigError(f"the task differs from the one {init_from} was trained on ({meta.task})")
    check_shape(recipe, model.cfg, f"the checkpoint {init_from}")
    set_dropout(model, recipe.model.get("dropout", model.cfg.dropout))
    task = task or load_task(meta.task["name"], **meta.task["options"])
    return model, tokenizers, state, task


def check_architecture(task: Task, recipe: Recipe) -> None:
    """ConfigError when the recipe's architecture cannot train `task`."""
    from .word_tasks import TASK_ARCHITECTURE

    want = TASK_ARCHITECTURE.get(task.name, "encoder-decoder")
    got = recipe.model.get("architecture", "encoder-decoder")
    if got != want:
        raise ConfigError(
            f"task {task.name} trains a {want} model but the recipe's architecture is {got}; "
            f'set "architecture": "{want}" in the recipe (see models/recipes/)'
        )


def check_shape(recipe: Recipe, cfg: ModelConfig, what: str) -> None:
    """ConfigError when the recipe's model shape differs from `cfg` (dropout may differ)."""
    want = recipe.shape()
    differ = [k for k, v in want.items() if getattr(cfg, k) != v]
    if differ:
        changes = ", ".join(f"{k} {getattr(cfg, k)!r} -> {want[k]!r}" for k in differ)
        raise ConfigError(
            f"--recipe changes the model shape of {what} ({changes}); only training fields "
            "and dropout can change. Use the recipe the run was trained with."
        )


def set_dropout(model: Seq2SeqTransformer, p: float) -> None:
    """Set every dropout probability of `model` (and its config) to `p`."""
    model.cfg.dropout = p
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p


def resumed_run(
    task: Task | None, recipe: Recipe | None, out: Path
) -> tuple[Seq2SeqTransformer, TokenizerPair, dict[str, Any], Recipe, Task, dict[str, Any]]:
    """Load OUT/last, checking that a given task matches the saved one. A given recipe may
    change training fields and dropout, not the model shape; the changes are returned."""
    if not (out / "last").exists():
        raise CheckpointError(f"nothing to resume: {out / 'last'} does not exist; drop --resume")
    model, tokenizers, meta = load_checkpoint(out / "last")
    saved = Recipe.from_dict(meta.train_state["recipe"])
    changed: dict[str, Any] = {}
    if recipe is not None:
        check_shape(recipe, model.cfg, str(out))
        old, new = saved.to_dict(), recipe.to_dict()
        ignored = ("epochs", "description")
        changed = {
            k: [old.get(k), v] for k, v in new.items() if old.get(k) != v and k not in ignored
        }
        if "dropout" in changed:
            set_dropout(model, recipe.model.get("dropout", model.cfg.dropout))
        saved = recipe
    if task is not None and task.describe() != meta.task:
        raise ConfigError(f"the task differs from the one {out} was trained on ({meta.task})")
    task = load_task(meta.task["name"], **meta.task["options"])
    state = {k: meta.train_state.get(k) for k in RUN_STATE_KEYS}
    if recipe is not None:
        state["epochs"] = recipe.epochs
    return model, tokenizers, state, saved, task, changed
