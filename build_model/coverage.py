"""What a run can train and score on, checked before the first step.

    examples, dropped = training_examples(task, tokenizers, max_len)

A pair is kept when its source and its target, each with one special token (`</s>`, or `<s>`
for the decoder input), fit `max_len` positions. Training refuses (DataError) when nothing is
left to learn from or to score: an empty train or dev split, no training pair that fits, no
dev pair that fits (the dev metrics would be a perfect score on nothing). Pairs left out for
length are reported as a warning (on the console as `warning: ...`): how many, what share,
the longest kept and the max_len that would keep them all.
"""

from __future__ import annotations

import logging

from edgeseq.runtime.errors import DataError
from edgeseq.runtime.tokenizer import TokenizerPair

from .tasks import Pair, Task

logger = logging.getLogger(__name__)

Example = tuple[list[int], list[int]]


def positions_needed(pairs: list[Pair], tokenizers: TokenizerPair) -> list[tuple[Example, int]]:
    """Per pair: its token ids (without specials) and the max_len it needs, the longer of
    source and target plus one special token."""
    out = []
    for source, target in pairs:
        src, tgt = tokenizers.source.encode(source), tokenizers.target.encode(target)
        out.append(((src, tgt), max(len(src), len(tgt)) + 1))
    return out


def training_examples(
    task: Task, tokenizers: TokenizerPair, max_len: int
) -> tuple[list[Example], int]:
    """The training examples that fit `max_len` and how many pairs were left out; raise
    DataError when the train or dev split leaves nothing to train on or to score."""
    where = f"task {task.name}" + (f" ({task.options['path']})" if "path" in task.options else "")
    sizes = f"{len(task.train)} train, {len(task.dev)} dev, {len(task.test)} test pairs"
    if not task.train or not task.dev:
        empty = "train" if not task.train else "dev"
        raise DataError(
            f"the {empty} split of {where} is empty ({sizes}; pairs are split by a hash of "
            "the source: ~90% train, ~5% dev, ~5% test): the dev split scores every epoch "
            "and picks the best checkpoint, so add pairs to the corpus (a few hundred)"
        )
    train = positions_needed(task.train, tokenizers)
    kept = [example for example, need in train if need <= max_len]
    needs = [need for _, need in train]
    if not kept:
        raise DataError(
            f"no training pair of {where} fits max_len {max_len}: all {len(train)} need more "
            f"positions (source or target tokens + 1); max_len {min(needs)} admits the "
            f"shortest, {max(needs)} admits all: raise max_len in the recipe"
        )
    dev_needs = [need for _, need in positions_needed(task.dev, tokenizers)]
    if min(dev_needs) > max_len:
        raise DataError(
            f"no dev pair of {where} fits max_len {max_len} (all {len(dev_needs)} need more "
            f"positions, at least {min(dev_needs)}): the dev metrics would score nothing; "
            f"raise max_len in the recipe to {max(dev_needs)} or more"
        )
    dropped = len(train) - len(kept)
    if dropped:
        longest = max(need for need in needs if need <= max_len)
        logger.warning(
            f"{dropped} of {len(train)} training pairs ({100 * dropped / len(train):.1f}%) "
            f"need more than max_len {max_len} positions and are left out; the longest kept "
            f"needs {longest}, max_len {max(needs)} would keep all"
        )
    return kept, dropped
