"""`edgeseq evaluate TARGET`: score a bundle (torch-free) or a checkpoint (torch) on a task
split or, for a bundle, on a source<TAB>target file.

    edgeseq evaluate g2p-en --split test                 # built-in bundle, its task's split
    edgeseq evaluate bundles/fr --data test.tsv          # any bundle, the user's own pairs
    edgeseq evaluate runs/g2p/best --split test          # a checkpoint: PyTorch

A TARGET with a manifest.json (or the name of a built-in bundle) is a bundle: it is scored
with onnxruntime by build_model/bundle_evaluation.py and needs no torch. Anything else is
taken as a checkpoint and scored by build_model/evaluation.py's `evaluate_model`, imported
only then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from edgeseq.build_model.bundle_evaluation import bundle_references, evaluate_bundle, is_bundle
from edgeseq.build_model.tasks import SPLITS, load_task
from edgeseq.runtime.constants import MANIFEST_FILE
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions, beam_search
from edgeseq.runtime.step import StepModel

from .options import provider_option, threads_option, variant_option


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("target", type=click.Path(path_type=Path))
@click.option(
    "--data",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Bundles: score on this source<TAB>target file instead of a task split.",
)
@click.option(
    "--split",
    type=click.Choice(SPLITS),
    default="test",
    show_default=True,
    help="The task split to score (ignored with --data).",
)
@click.option("--limit", type=click.IntRange(1), help="Score only the first N sources.")
@click.option(
    "--beam",
    type=click.IntRange(1),
    help="Beam search width (default: a bundle's generation default, else greedy).",
)
@click.option(
    "--length-penalty",
    type=float,
    help="With --beam: rank hypotheses by logprob / length**penalty [default: the bundle's, "
    "else 1.0].",
)
@click.option("--batch-size", type=click.IntRange(1), default=128, show_default=True)
@threads_option()
@provider_option()
@variant_option()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def evaluate(
    target: Path,
    data: Path | None,
    split: str,
    limit: int | None,
    beam: int | None,
    length_penalty: float | None,
    batch_size: int,
    threads: int | None,
    provider: str | None,
    variant: str | None,
    as_json: bool,
) -> None:
    """Score TARGET, a bundle or a checkpoint, against references: exact match, CER and WER
    for every task, PER for g2p, BLEU and chrF for text tasks.

    A bundle (a directory with manifest.json, or a built-in name such as g2p-en) is scored
    with onnxruntime, without torch, on --data FILE or on its task's --split. A checkpoint
    is scored with PyTorch on its task's --split (needs the train extra).
    """
    if length_penalty is not None and not beam:
        raise OptionsError("--length-penalty ranks beam hypotheses: add --beam N")
    how = Scoring(split, limit, beam, length_penalty, batch_size, threads)
    if not is_bundle(target):
        if data is not None or provider is not None or variant is not None:
            raise OptionsError(
                f"{target} is not a bundle (no {MANIFEST_FILE}): --data, --provider and "
                "--variant apply to bundles; a checkpoint is scored on its task's --split"
            )
        result, metrics = _evaluate_checkpoint(target, how)
        task = result["task"]
        header = f"{target}: task {task['name']} {task['options']}, {split} split"
    else:
        result, metrics = _evaluate_bundle(target, how, data, provider, variant)
        task_name = (result["task"] or {}).get("name", "unknown task")
        header = f"{target}: task {task_name}, {result['data']}"
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    click.echo(f"{header}, {result['search']}, {int(metrics['count'])} sources")
    for key, value in metrics.items():
        if key != "count":
            click.echo(f"  {key:<13} {value:.4f}")


@dataclass(frozen=True)
class Scoring:
    """What to score and how: the options a bundle and a checkpoint both take."""

    split: str
    limit: int | None
    beam: int | None
    length_penalty: float | None
    batch_size: int
    threads: int | None


def _evaluate_bundle(
    target: Path, how: Scoring, data: Path | None, provider: str | None, variant: str | None
) -> tuple[dict[str, Any], dict[str, float]]:
    """The --json object of a bundle's scores, and the scores alone."""
    generator = Generator.load(target, providers=provider, threads=how.threads, variant=variant)
    references = bundle_references(generator.bundle.task, data, how.split)
    # unset options: the bundle's generation defaults (docs/generation.md), as in generate
    options = GenerationOptions(beam_size=how.beam, length_penalty=how.length_penalty,
                                batch_size=how.batch_size, truncate=True)  # fmt: skip
    options = generator.resolve(options)
    metrics = evaluate_bundle(generator, references, options, how.limit)
    scored = str(data) if data is not None else f"{how.split} split"
    search = f"beam {options.beam_size}" if options.method == "beam" else "greedy"
    result = {"bundle": str(target), "task": generator.bundle.task, "data": scored,
              "search": search, **metrics}  # fmt: skip
    return result, metrics


def _evaluate_checkpoint(checkpoint: Path, how: Scoring) -> tuple[dict[str, Any], dict[str, float]]:
    """The --json object of CHECKPOINT's scores on its task's split, and the scores alone;
    PyTorch is imported here. The task (and options such as --no-stress) are read from
    CHECKPOINT/task.json; a source counts as correct when the output equals any of its
    references; "per" is the edit distance to the closest reference over its length."""
    import torch

    from edgeseq.build_model.checkpoint import load_checkpoint
    from edgeseq.build_model.evaluation import evaluate_model

    beam = how.beam
    penalty = 1.0 if how.length_penalty is None else how.length_penalty
    # GenerationOptions is the one validator of beam size, length penalty and batch size.
    GenerationOptions(beam_size=1 if beam is None else beam, length_penalty=penalty,
                      batch_size=how.batch_size)  # fmt: skip
    if how.threads:
        torch.set_num_threads(how.threads)
    model, tokenizers, meta = load_checkpoint(checkpoint)
    task = load_task(meta.task["name"], **meta.task["options"])
    search = _beam(beam, penalty) if beam else None
    metrics = evaluate_model(model, tokenizers, task, how.split, how.limit, how.batch_size, search)
    result = {"checkpoint": str(checkpoint), "task": meta.task, "split": how.split,
              "search": _search_name(beam, how.length_penalty), **metrics}  # fmt: skip
    return result, metrics


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
