"""The training loop, as a library function (the `edgeseq train` command only parses options).

    task = load_task("reverse")
    recipe = Recipe.load("models/recipes/tiny.json")
    summary = train(task, recipe, "runs/rev", seed=0, max_minutes=3)
    summary = train(None, None, "runs/rev", resume=True, epochs=20)   # continue exactly

Adam (0.9, 0.98, 1e-9) with the paper's schedule lr = factor * d_model^-0.5 *
min(step^-0.5, step * warmup^-1.5) (or, with `schedule: linear`, the same warm-up and peak
then a straight line to 0 at the run's last step), label-smoothed cross-entropy that
ignores padding, gradient-norm clipping, length-bucketed batches of at most `batch_tokens`
padded tokens.
After every epoch (and when stopped by a budget) the dev split is scored: loss over up to
`eval_loss_max_items` pairs and greedy exact match / WER / PER over up to `eval_max_items`
sources. OUT/last holds the latest state (also every `save_every` steps), OUT/best the best
dev exact match (ties: lower dev loss), OUT/epochs/NNN the weights after each of the last
`keep_epochs` epochs; OUT/log.jsonl and OUT/loss.png record the run.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from tqdm import tqdm

from edgeseq.runtime.atomic import check_writable
from edgeseq.runtime.errors import ConfigError
from edgeseq.runtime.tokenizer import TokenizerPair

from .batching import collate
from .checkpoint import restore_training, save_checkpoint
from .coverage import training_examples
from .distill import distillation_loss, load_teachers, teacher_logits
from .evaluation import dev_metrics, plot_log
from .model import Seq2SeqTransformer
from .precision import warn_if_bf16_slow
from .recipe import SCHEDULES, Recipe
from .run import new_run, resumed_run
from .tasks import Task, make_batches


def learning_rate(
    step: int,
    d_model: int,
    warmup: int,
    factor: float,
    schedule: str = "inverse_sqrt",
    total_steps: int | None = None,
) -> float:
    """The learning rate at `step` >= 1. Both schedules warm up linearly to the same peak,
    factor * d_model^-0.5 * warmup^-0.5, at `warmup`; then "inverse_sqrt" (the paper's) is
    factor * d_model^-0.5 * step^-0.5 and "linear" falls in a straight line to 0 at
    `total_steps` (the last step of the run)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}; use inverse_sqrt or linear")
    step = max(step, 1)
    if schedule == "inverse_sqrt" or step <= warmup:
        return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    if total_steps is None:
        raise ConfigError("the linear schedule needs the run's total number of steps")
    peak = factor * (d_model * warmup) ** -0.5
    return peak * max(0.0, (total_steps - step) / max(total_steps - warmup, 1))


def train(
    task: Task | None,
    recipe: Recipe | None,
    out: str | Path,
    *,
    resume: bool = False,
    init_from: str | Path | None = None,
    seed: int = 0,
    epochs: int | None = None,
    max_minutes: float | None = None,
    max_steps: int | None = None,
    threads: int | None = None,
    progress: bool = True,
    teachers: list[str | Path] | None = None,
) -> dict[str, Any]:
    """Train `task` with `recipe` into directory `out`; return a summary dict.

    With `resume`, task, recipe and seed come from OUT/last (task and recipe may be None) and
    training continues exactly where it stopped; a given recipe may change the training fields
    and dropout (logged), not the model shape. With `init_from`, a new run starts from that
    checkpoint's weights, tokenizers and task, with a fresh optimizer and schedule. `epochs`
    overrides the recipe's; training stops cleanly (evaluation + checkpoint) after
    `max_minutes` or `max_steps` (this call). With `teachers` (checkpoints with the model's
    tokenizers), a new run also learns their next-token distributions (build_model.distill;
    recipe fields distill_weight, distill_temperature); a resumed run keeps its teachers."""
    out = Path(out)
    if threads:
        torch.set_num_threads(threads)
    changed: dict[str, Any] = {}
    if resume and init_from is not None:
        raise ConfigError("--init-from starts a new run; it cannot be combined with --resume")
    if resume and teachers:
        raise ConfigError("--teacher is fixed when a run starts; --resume keeps the run's own")
    if resume:
        model, tokenizers, state, recipe, task, changed = resumed_run(task, recipe, out)
    elif recipe is None:
        raise ConfigError("a new run needs a recipe")
    else:
        init = Path(init_from) if init_from is not None else None
        model, tokenizers, state, task = new_run(task, recipe, out, seed, init)
        state["teachers"] = [str(Path(t).resolve()) for t in teachers or []]  # resumable anywhere
    total_epochs = epochs or state.get("epochs") or recipe.epochs
    if resume and state["epoch"] >= total_epochs:
        message = f"already trained {state['epoch']} epochs; pass a larger --epochs"
        return {**state, "message": message}
    trainer = Trainer(model, tokenizers, task, recipe, out, state, total_epochs, progress)
    if resume:
        restore_training(out / "last", trainer.optimizer)
    start = {"resume": resume, "threads": torch.get_num_threads(), **trainer.info}
    slowdown = warn_if_bf16_slow(recipe)
    if slowdown is not None:
        start["bf16_vs_fp32"] = round(slowdown, 2)
    if init_from is not None:
        start["init_from"] = str(init_from)
    if changed:
        start["recipe_changed"] = changed
    trainer.log.write(event="start", **start)
    deadline = time.monotonic() + max_minutes * 60 if max_minutes else math.inf
    started, metrics, stopped = time.monotonic(), {}, False
    for epoch in range(state["epoch"], total_epochs):
        stopped = trainer.run_epoch(epoch, deadline, max_steps)
        metrics = trainer.evaluate_and_save()
        if stopped:
            break
    elapsed = time.monotonic() - started
    summary = {**state, "dev": metrics, "elapsed_s": elapsed, "steps": trainer.steps}
    summary.update(tokens_per_s=trainer.tokens / max(trainer.train_s, 1e-9), stopped_early=stopped)
    trainer.log.write(event="stop", **{k: v for k, v in summary.items() if k != "best"})
    return summary


class Trainer:
    """The state of one training call: model, optimizer, data, run state and log."""

    def __init__(
        self,
        model: Seq2SeqTransformer,
        tokenizers: TokenizerPair,
        task: Task,
        recipe: Recipe,
        out: Path,
        state: dict[str, Any],
        epochs: int,
        progress: bool = True,
    ) -> None:
        self.model, self.tokenizers, self.task = model.train(), tokenizers, task
        self.recipe = recipe
        self.out, self.state, self.epochs, self.progress = out, state, epochs, progress
        betas, eps = (0.9, 0.98), 1e-9
        self.optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=betas, eps=eps)
        # DataError when nothing fits or dev is empty; a warning counts pairs left out
        self.examples, dropped = training_examples(task, tokenizers, model.cfg.max_len)
        self.lengths = [(len(s) + 1, len(t) + 1) for s, t in self.examples]
        self.steps = self.tokens = 0  # in this call
        self.train_s = 0.0  # seconds spent in training steps (evaluation excluded)
        self.log = _Log(out / "log.jsonl")
        params = sum(p.numel() for p in model.parameters())
        self.info = {"step": state["step"], "seed": state["seed"], "task": task.describe()}
        self.info.update(recipe=recipe.to_dict(), params=params, dropped_too_long=dropped)
        self.info["train_examples"] = len(self.examples)
        self.teachers = load_teachers(state.get("teachers") or [], tokenizers, model.cfg)
        if self.teachers:
            self.info["teachers"] = state["teachers"]
        self.total_steps = self.count_steps(epochs) if recipe.schedule == "linear" else None
        if self.total_steps is not None:
            self.info["total_steps"] = self.total_steps

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The example indices of each batch of `epoch`, fixed by the seed and the epoch (the
        same batches when resumed)."""
        rng = np.random.default_rng([self.state["seed"], epoch])
        recipe = self.recipe
        return make_batches(self.lengths, recipe.batch_tokens, rng, recipe.bucket_noise)

    def count_steps(self, epochs: int) -> int:
        """The number of steps in `epochs` epochs of this recipe's batches (exact for a run
        that keeps its recipe)."""
        return sum(len(self.epoch_batches(epoch)) for epoch in range(epochs))

    def train_step(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[float, float]:
        """One update on src (B, S), tgt_in (B, T), tgt_out (B, T); returns the label-smoothed
        loss it minimised (mixed with the distillation term when the run has teachers) and the
        plain cross-entropy (comparable with the dev loss)."""
        cfg, recipe = self.model.cfg, self.recipe
        self.state["step"] += 1
        step = self.state["step"]
        lr = learning_rate(
            step, cfg.d_model, recipe.warmup, recipe.lr_factor, recipe.schedule, self.total_steps
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.precision == "bf16"):
            logits = self.model(src, tgt_in)
        tgt_out = tgt_out[:, : logits.shape[1]]  # a classifier predicts the first target only
        logits = logits.float().reshape(-1, cfg.tgt_vocab_size)  # (B * T, V)
        targets = tgt_out.reshape(-1)  # (B * T,)
        smoothing = recipe.label_smoothing
        loss = F.cross_entropy(logits, targets, ignore_index=cfg.pad_id, label_smoothing=smoothing)
        if self.teachers:
            bf16 = recipe.precision == "bf16"
            teachers = [
                t.reshape(logits.shape) for t in teacher_logits(self.teachers, src, tgt_in, bf16)
            ]
            kd = distillation_loss(
                logits, teachers, targets != cfg.pad_id, recipe.distill_temperature
            )
            loss = (1 - recipe.distill_weight) * loss + recipe.distill_weight * kd
        with torch.no_grad():
            nll = F.cross_entropy(logits, targets, ignore_index=cfg.pad_id)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if recipe.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), recipe.clip)
        self.optimizer.step()
        return loss.item(), nll.item()

    def run_epoch(self, epoch: int, deadline: float, max_steps: int | None) -> bool:
        """Train the rest of `epoch`; True when stopped early by the deadline or max_steps."""
        cfg, state = self.model.cfg, self.state
        batches = self.epoch_batches(epoch)
        bar = tqdm(
            total=len(batches),
            initial=state["batch_in_epoch"],
            unit="batch",
            desc=f"epoch {epoch + 1}/{self.epochs}",
            disable=not self.progress,
        )
        window_tokens, window_start, stopped = 0, time.monotonic(), False
        epoch_start = time.monotonic()
        for index in range(state["batch_in_epoch"], len(batches)):
            src, tgt_in, tgt_out = collate(self.examples, batches[index], cfg)
            loss, nll = self.train_step(src, tgt_in, tgt_out)
            state["batch_in_epoch"] = index + 1
            tokens = int((src != cfg.pad_id).sum() + (tgt_out != cfg.pad_id).sum())
            self.steps += 1
            self.tokens += tokens
            window_tokens += tokens
            rate = window_tokens / max(time.monotonic() - window_start, 1e-9)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:.0f}", refresh=False)
            if state["step"] % self.recipe.log_every == 0:
                lr = self.optimizer.param_groups[0]["lr"]
                self.log.write(
                    event="step",
                    step=state["step"],
                    epoch=epoch,
                    loss=loss,
                    nll=nll,
                    lr=lr,
                    tokens_per_s=rate,
                )
                window_tokens, window_start = 0, time.monotonic()
            if state["step"] % self.recipe.save_every == 0:
                self.save("last", with_optimizer=True)
            if time.monotonic() >= deadline or (max_steps is not None and self.steps >= max_steps):
                stopped = index + 1 < len(batches) or epoch + 1 < self.epochs
                break
        bar.close()
        self.train_s += time.monotonic() - epoch_start
        if state["batch_in_epoch"] >= len(batches):
            state["epoch"], state["batch_in_epoch"] = epoch + 1, 0
        state["finished"] = state["epoch"] >= self.epochs
        return stopped

    def save(self, name: str, with_optimizer: bool) -> None:
        """Write OUT/name (with the optimizer and RNG state when `with_optimizer`)."""
        train_state = {**self.state, "recipe": self.recipe.to_dict(), "epochs": self.epochs}
        optimizer = self.optimizer if with_optimizer else None
        save_checkpoint(
            self.out / name,
            self.model,
            self.tokenizers,
            self.task.describe(),
            train_state,
            optimizer,
        )

    def evaluate_and_save(self) -> dict[str, Any]:
        """Score the dev split; save OUT/last, and OUT/best when exact match (then dev loss)
        improved; redraw the loss curve. Returns the metrics."""
        start = time.monotonic()
        metrics = dev_metrics(self.model, self.task, self.tokenizers, self.recipe)
        metrics["eval_s"] = time.monotonic() - start
        best = self.state["best"]
        improved = best is None or _rank(metrics) > _rank(best)
        if improved:
            self.state["best"] = {**metrics, "step": self.state["step"]}
        self.log.write(event="eval", step=self.state["step"], epoch=self.state["epoch"], **metrics)
        self.save("last", with_optimizer=True)
        if improved:
            self.save("best", with_optimizer=False)
        if self.recipe.keep_epochs and self.state["batch_in_epoch"] == 0:
            self.keep_epoch()
        plot_log(self.out / "log.jsonl", self.out / "loss.png")
        self.model.train()
        return metrics

    def keep_epoch(self) -> None:
        """Save the weights of the epoch just finished as OUT/epochs/NNN; keep the newest
        `keep_epochs` of them (inputs for `edgeseq average`)."""
        self.save(f"epochs/{self.state['epoch']:03d}", with_optimizer=False)
        kept = sorted(p for p in (self.out / "epochs").iterdir() if p.name.isdigit())
        for old in kept[: -self.recipe.keep_epochs]:
            shutil.rmtree(old)


def _rank(metrics: dict[str, Any]) -> tuple[float, float]:
    """Higher is better: dev exact match, then lower dev loss."""
    return metrics["exact_match"], -metrics["dev_loss"]


class _Log:
    """Appends one JSON object per line, with wall-clock time."""

    def __init__(self, path: Path) -> None:
        check_writable(path)  # OutputPathError naming the cause; creates the run directory
        self.path = path

    def write(self, **record: Any) -> None:
        """Append `record` (JSON-able values) with the current time."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"time": time.time(), **record}, sort_keys=True) + "\n")
