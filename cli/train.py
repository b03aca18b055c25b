"""`edgeseq train`: option parsing over build_model/train.py's `train`.

edgeseq train --task reverse --recipe models/recipes/tiny.json --out runs/rev
edgeseq train --task g2p --recipe models/recipes/g2p-small.json --out runs/g2p --max-minutes 30
edgeseq train --out runs/g2p --resume --epochs 20

The training library (torch) is imported when the command runs, so `--help` needs no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgeseq.build_model.recipe import Recipe
from edgeseq.build_model.tasks import TASK_NAMES, load_task
from edgeseq.runtime.errors import ConfigError
from edgeseq.runtime.tokenizer import KINDS

from .options import threads_option


def _task_options(
    task: str,
    no_stress: bool,
    data: Path | None,
    kind: str,
    target_kind: str | None,
    vocab_size: int,
) -> dict[str, Any]:
    """Options of `load_task(task, ...)` from the command line; refuses options of other tasks."""
    if no_stress and task != "g2p":
        raise ConfigError("--no-stress applies to --task g2p only")
    if task == "tsv":
        if data is None:
            raise ConfigError("--task tsv needs --data FILE (lines of source<TAB>target)")
        return {
            "path": str(data),
            "kind": kind,
            "target_kind": target_kind,
            "vocab_size": vocab_size,
        }
    if data is not None:
        raise ConfigError("--data applies to --task tsv only")
    return {"stress": not no_stress} if task == "g2p" else {}


@click.command()
@click.option(
    "--task", type=click.Choice(TASK_NAMES), help="What to learn (not needed with --resume)."
)
@click.option(
    "--recipe",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Recipe JSON: model and training fields (see models/recipes/).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Run directory: best/, last/, log.jsonl, loss.png.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run in --out from its last checkpoint (a --recipe given with it may "
    "change training fields and dropout, not the model shape).",
)
@click.option(
    "--init-from",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Start a new run from this checkpoint's weights, tokenizers and task (fresh "
    "optimizer and schedule), e.g. to fine-tune models/g2p-en.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of weights, dropout and batch order (a resumed run keeps its own).",
)
@click.option(
    "--teacher",
    "teachers",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Distil from this checkpoint (repeat for an ensemble): the loss mixes in the "
    "teachers' next-token distributions (recipe: distill_weight, distill_temperature). "
    "Teachers need the model's tokenizers; a resumed run keeps its own.",
)
@click.option("--epochs", type=int, help="Override the recipe's epoch count.")
@click.option("--max-minutes", type=float, help="Time budget; stops after the current step.")
@threads_option(help="torch intra-op threads (default: torch's choice).")
@click.option("--no-stress", is_flag=True, help="g2p: strip stress digits from phonemes.")
@click.option(
    "--data",
    type=click.Path(dir_okay=False, path_type=Path),
    help="tsv: corpus file of source<TAB>target lines.",
)
@click.option(
    "--kind",
    type=click.Choice(KINDS),
    default="char",
    show_default=True,
    help="tsv: source tokenizer kind.",
)
@click.option("--target-kind", type=click.Choice(KINDS), help="tsv: target kind (default --kind).")
@click.option(
    "--vocab-size",
    type=int,
    default=8000,
    show_default=True,
    help="tsv with bpe: vocabulary entries.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(
    task: str | None,
    recipe: Path | None,
    out: Path,
    resume: bool,
    init_from: Path | None,
    seed: int,
    teachers: tuple[Path, ...],
    epochs: int | None,
    max_minutes: float | None,
    threads: int | None,
    no_stress: bool,
    data: Path | None,
    kind: str,
    target_kind: str | None,
    vocab_size: int,
    quiet: bool,
) -> None:
    """Train a model on a task; OUT/best and OUT/last are checkpoints.

    \b
    Examples:
      edgeseq train --task reverse --recipe models/recipes/tiny.json --out runs/rev
      edgeseq train --task g2p --no-stress --recipe models/recipes/g2p-small.json --out runs/g2p
      edgeseq train --task tsv --data pairs.tsv --kind bpe --recipe my.json --out runs/mt
      edgeseq train --out runs/g2p --resume --epochs 20
      edgeseq train --init-from models/g2p-en --out runs/ft \\
          --recipe models/g2p-en/recipes/8-dropout-0.05-7x7.json
      edgeseq train --init-from runs/a --teacher runs/a --teacher runs/b --recipe R --out runs/kd
    """
    from edgeseq.build_model.run import refuse_existing_run  # torch: imported when run
    from edgeseq.build_model.train import train as train_run

    if resume and init_from is not None:
        raise ConfigError("--init-from starts a new run; drop it to --resume --out")
    if not resume and recipe is None:
        raise ConfigError("a new run needs --recipe (or --resume to continue --out)")
    if not resume and task is None and init_from is None:
        raise ConfigError("a new run needs --task (or --init-from a checkpoint)")
    if not resume:
        refuse_existing_run(out)  # before the slow data loading
    loaded_recipe = Recipe.load(recipe) if recipe is not None else None
    loaded_task = None
    if task is not None:
        options = _task_options(task, no_stress, data, kind, target_kind, vocab_size)
        loaded_task = load_task(task, **options)
        click.echo(
            f"task {task}: {len(loaded_task.train)} train, {len(loaded_task.dev)} dev, "
            f"{len(loaded_task.test)} test pairs",
            err=True,
        )
    summary = train_run(
        loaded_task,
        loaded_recipe,
        out,
        resume=resume,
        init_from=init_from,
        seed=seed,
        epochs=epochs,
        max_minutes=max_minutes,
        threads=threads,
        progress=not quiet,
        teachers=list(teachers),
    )
    if "message" in summary:
        click.echo(summary["message"])
        return
    dev = summary["dev"]
    status = "finished" if summary["finished"] else "stopped (resume with --resume)"
    click.echo(
        f"{status} at step {summary['step']}, epoch {summary['epoch']}: "
        f"{summary['tokens_per_s']:.0f} tokens/s over {summary['elapsed_s']:.0f} s"
    )
    click.echo("dev: " + _format(dev))
    best = summary["best"]
    click.echo(f"best (step {best['step']}): {_format(best)} -> {out / 'best'}")


def _format(metrics: dict[str, Any]) -> str:
    keys = ("exact_match", "wer", "per", "wer_nostress", "per_nostress", "dev_loss")
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in keys if k in metrics)
