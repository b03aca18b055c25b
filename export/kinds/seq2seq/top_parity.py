"""Parity group `top`: greedy and beam search reading the decoder's search outputs
(`topk_ids`, `topk_logits`, `log_normalizer`: export/top_outputs.py) against the same
searches reading the whole `logits` (numpy's float64 log-softmax), on the level-3 sources.

    group = top_parity(engine, held.sources, max_new_tokens)   # engine: an OrtStep
    add_group(report, "top", group)                           # export/parity.py

Within a row both paths rank tokens exactly alike (the float32 logits' order, ties by the
lower id); across a beam's hypotheses they can differ where two candidates' summed
log-probabilities are within the graph's float32 normaliser error (~1e-6). Ids must be
identical, or, where they differ, both paths' best scores within TOP_SCORE_TOLERANCE (a
near tie, counted); scores within TOP_SCORE_TOLERANCE everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import Hypothesis, beam_search, choose_argmax, token_search
from edgeseq.runtime.step import StepModel

from .parity import parity_batch

TOP_BEAM_SIZE = 4
TOP_SCORE_TOLERANCE = 1e-4  # |Δ score| between the paths, and what counts as a near tie


@contextmanager
def logits_path(model: StepModel) -> Iterator[StepModel]:
    """`model` with its search outputs hidden (`top_width` 0): the searches read logits."""
    width = getattr(model, "top_width", 0)
    model.top_width = 0  # type: ignore[attr-defined]
    try:
        yield model
    finally:
        model.top_width = width  # type: ignore[attr-defined]


def both_paths(
    model: StepModel, src_ids: Any, beam_size: int, max_new_tokens: int | None
) -> tuple[list[list[Hypothesis]], list[list[Hypothesis]]]:
    """(logits path, search-output path) hypotheses on src_ids int64 (B, S): greedy search
    (`token_search` with the arg-max) for beam_size 1, else beam search returning every
    hypothesis."""

    def run() -> list[list[Hypothesis]]:
        if beam_size == 1:
            return [[h] for h in token_search(model, src_ids, max_new_tokens, choose_argmax)]
        return beam_search(model, src_ids, beam_size, max_new_tokens, n_best=beam_size)

    with logits_path(model):
        old = run()
    return old, run()


def compare(
    model: StepModel, sources: Sequence[Sequence[int]], beam_size: int, max_new: int | None
) -> dict[str, Any]:
    """The numbers of one search (beam_size 1: greedy) over `sources` in batches of
    `parity_batch`."""
    identical = near_ties = 0
    worst, mismatches = 0.0, []
    batch = parity_batch(model.vocab_size, beam_size)
    for start in range(0, len(sources), batch):
        src = right_pad(sources[start : start + batch], model.pad_id)
        old, new = both_paths(model, src, beam_size, max_new)
        for offset, (a, b) in enumerate(zip(old, new, strict=True)):
            if [h.tokens for h in a] == [h.tokens for h in b]:
                identical += 1
                worst = max([worst, *(abs(x.score - y.score) for x, y in zip(a, b, strict=True))])
                continue
            tie = abs(a[0].score - b[0].score) <= TOP_SCORE_TOLERANCE
            near_ties += tie
            if len(mismatches) < 5:
                entry = {"index": start + offset, "near_tie": bool(tie)}
                mismatches.append(entry | {"logits_ids": list(a[0].tokens)})
                mismatches[-1]["top_ids"] = list(b[0].tokens)
    return {
        "beam_size": beam_size,
        "inputs": len(sources),
        "identical": identical,
        "near_ties": near_ties,
        "max_score_diff": worst,
        "mismatches": mismatches,
        "passed": identical + near_ties == len(sources) and worst <= TOP_SCORE_TOLERANCE,
    }


def top_parity(
    model: StepModel, sources: Sequence[Sequence[int]], max_new_tokens: int | None
) -> dict[str, Any]:
    """Greedy and beam-TOP_BEAM_SIZE ids and scores of `model` (a step model whose decoder has
    the search outputs) on both paths; `passed` when both searches pass."""
    greedy = compare(model, sources, 1, max_new_tokens)
    beam = compare(model, sources, TOP_BEAM_SIZE, max_new_tokens)
    return {
        "passed": greedy["passed"] and beam["passed"],
        "top_width": int(getattr(model, "top_width", 0)),
        "greedy": greedy,
        "beam": beam,
    }


def top_failure(group: dict[str, Any]) -> str:
    """The ParityError message of a failed `top` group."""
    parts = [
        f"{name}: {e['identical']}/{e['inputs']} identical, {e['near_ties']} near ties, "
        f"max |Δscore| {e['max_score_diff']:.1e}"
        for name, e in ((n, group[n]) for n in ("greedy", "beam"))
    ]
    return (
        "the decoder's top-k outputs change the searches' ids beyond near ties ("
        + "; ".join(parts)
        + "): export with a current edgeseq, or report the bundle"
    )
