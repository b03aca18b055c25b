"""`edgeseq train` and `edgeseq evaluate`: option parsing over `train.train` and `evaluate_model`.

edgeseq train --task reverse --recipe models/recipes/tiny.json --out runs/rev
edgeseq train --task g2p --recipe models/recipes/g2p-small.json --out runs/g2p --max-minutes 30
edgeseq train --out runs/g2p --resume --epochs 20
edgeseq evaluate runs/g2p/best --split test
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np

from edgeseq.runtime.errors import ConfigError, OptionsError
from edgeseq.runtime.search import GenerationOptions, beam_search
from edgeseq.runtime.step import StepModel
from edgeseq.runtime.tokenizer import KINDS

from .recipe import Recipe
from .tasks import TASK_NAMES, load_task


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
@click.option("--threads", type=int, help="torch intra-op threads (default: torch's choice).")
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
    from .run import refuse_existing_run  # torch: imported when run, so --help needs none
    from .train import train as train_run

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


def _beam(beam_size: int, length_penalty: float = 1.0):
    """A search callable (model, src_ids, max_new_tokens) -> best ids per row of beam search.

    Finished hypotheses are ranked by logprob / length**length_penalty.
    """

    def search(model: StepModel, src_ids: np.ndarray, max_new_tokens: int) -> list[list[int]]:
        """src_ids int64 (B, S) -> the best hypothesis' ids per row (no <s>, no </s>)."""
        found = beam_search(model, src_ids, beam_size, max_new_tokens, length_penalty)
        return [list(hyps[0].tokens) for hyps in found]

    return search


def _search_name(beam: int | None, length_penalty: float | None) -> str:
    """'greedy', 'beam 4' or, with a non-default penalty, 'beam 4, length penalty 0.6'."""
    if not beam:
        return "greedy"
    if length_penalty is None or length_penalty == 1.0:
        return f"beam {beam}"
    return f"beam {beam}, length penalty {length_penalty:g}"


@click.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option(
    "--split",
    type=click.Choice(["train", "dev", "test"]),
    default="test",
    show_default=True,
    help="train: how well the model fits the words it learned from (with --limit: the first N).",
)
@click.option("--limit", type=int, help="Score only the first N sources of the split.")
@click.option("--beam", type=int, help="Beam search with this width (default: greedy).")
@click.option(
    "--length-penalty",
    type=float,
    help="With --beam: rank finished hypotheses by logprob / length**penalty [default: 1.0].",
)
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option("--threads", type=int, help="torch intra-op threads.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def evaluate(
    checkpoint: Path,
    split: str,
    limit: int | None,
    beam: int | None,
    length_penalty: float | None,
    batch_size: int,
    threads: int | None,
    as_json: bool,
) -> None:
    """Score CHECKPOINT on its task's train, dev or test split: exact match, WER, PER.

    The task (and options such as --no-stress) are read from CHECKPOINT/task.json. A source
    counts as correct when the output equals any of its references (G2P words with several
    pronunciations); "per" (phoneme or token error rate) is the edit distance to the closest
    reference over that reference's length.
    """
    import torch

    from .checkpoint import load_checkpoint
    from .evaluation import evaluate_model

    if length_penalty is not None and not beam:
        raise OptionsError("--length-penalty ranks beam hypotheses: add --beam N")
    penalty = 1.0 if length_penalty is None else length_penalty
    # GenerationOptions is the one validator of beam size, length penalty and batch size.
    GenerationOptions(beam_size=1 if beam is None else beam, length_penalty=penalty,
                      batch_size=batch_size)  # fmt: skip
    if limit is not None and limit < 1:
        raise OptionsError(f"--limit must be >= 1, got {limit}")
    if threads:
        torch.set_num_threads(threads)
    model, tokenizers, meta = load_checkpoint(checkpoint)
    task = load_task(meta.task["name"], **meta.task["options"])
    search = _beam(beam, penalty) if beam else None
    metrics = evaluate_model(model, tokenizers, task, split, limit, batch_size, search)
    result = {
        "checkpoint": str(checkpoint),
        "task": meta.task,
        "split": split,
        "search": _search_name(beam, length_penalty),
        **metrics,
    }
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    click.echo(
        f"{checkpoint}: task {meta.task['name']} {meta.task['options']}, {split} split, "
        f"{result['search']}, {int(metrics['count'])} sources"
    )
    for key, value in metrics.items():
        if key != "count":
            click.echo(f"  {key:<13} {value:.4f}")


@click.command()
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write.")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16"]),
    default="float32",
    show_default=True,
    help="Storage type of the averaged weights: float16 halves model.safetensors (to ship a "
    "model under a size budget); every command loads them back as float32.",
)
def average(checkpoints: tuple[Path, ...], out: Path, dtype: str) -> None:
    """Average the weights of CHECKPOINTS (one run's) into a new checkpoint at --out.

    Averaging the last few epochs' weights, as the Transformer paper did, usually scores better
    than any one of them. `edgeseq train` keeps the last `keep_epochs` epochs of a run
    (a recipe field) under OUT/epochs/ for this.

    With one checkpoint and --dtype float16 it writes a half-size copy of its weights.

    \b
    Example:
      edgeseq average runs/g2p/epochs/* --out runs/g2p/averaged
      edgeseq evaluate runs/g2p/averaged --split dev
      edgeseq average runs/g2p/epochs/040 --out runs/g2p/ship --dtype float16
    """
    from .checkpoint import average_checkpoints

    path = average_checkpoints(list(checkpoints), out, weights_dtype=dtype)
    stored = "" if dtype == "float32" else f" (weights stored as {dtype})"
    count = f"{len(checkpoints)} checkpoint{'s' if len(checkpoints) > 1 else ''}"
    click.echo(f"averaged {count} -> {path}{stored}")


@click.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write.")
@click.option(
    "--encoder-layers",
    type=click.IntRange(min=1),
    help="Encoder layers of the result (at least the checkpoint's; default: the same).",
)
@click.option(
    "--decoder-layers",
    type=click.IntRange(min=1),
    help="Decoder layers of the result (at least the checkpoint's; default: the same).",
)
@click.option(
    "--d-ff",
    type=click.IntRange(min=1),
    help="FFN hidden size of the result (at least the checkpoint's; default: the same).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of new FFN weights.")
def grow(
    checkpoint: Path,
    out: Path,
    encoder_layers: int | None,
    decoder_layers: int | None,
    d_ff: int | None,
    seed: int,
) -> None:
    """Write a deeper and/or wider copy of CHECKPOINT at --out, to train on.

    Deeper (layer stacking): each new layer is a copy of a trained one; 3 -> 6 layers repeats
    every layer once ([0, 0, 1, 1, 2, 2]); 3 -> 4 repeats the lowest ([0, 0, 1, 2]). The
    deeper model scores worse than the original until it is trained. Wider (--d-ff): every
    FFN gets new hidden units whose output weights are zero, so the wider model computes
    exactly what the original did, with room to learn more. Continue with
    `edgeseq train --init-from OUT` and a recipe of the new shape.

    \b
    Examples:
      edgeseq grow models/g2p-en --out runs/g2p-44 --encoder-layers 4 --decoder-layers 4
      edgeseq train --init-from runs/g2p-44 --recipe models/g2p-en/recipes/3-grow-4x4.json \\
        --out runs/g2p-deeper
      edgeseq grow models/g2p-en --out runs/g2p-wide --d-ff 1536
    """
    from .checkpoint import grow_checkpoint, load_checkpoint

    path = grow_checkpoint(checkpoint, out, encoder_layers, decoder_layers, d_ff, seed)
    model, _, meta = load_checkpoint(path)
    layers, widths = meta.train_state["grown_layers"], meta.train_state["grown_d_ff"]
    wider = f", d_ff {widths[0]} -> {widths[1]}" if widths[0] != widths[1] else ""
    click.echo(
        f"grew {checkpoint} -> {path}: encoder layers {layers['encoder']}, "
        f"decoder layers {layers['decoder']}{wider} "
        f"({sum(p.numel() for p in model.parameters()):,} parameters)"
    )
