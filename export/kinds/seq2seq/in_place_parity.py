"""Parity of the in-place cache decoder (in_place_graph.py) with `decoder.onnx`.

    group = in_place_parity_group(directory, config, ["fp32", "int8"], sources)
    check_group({"inplace": group}, "inplace", in_place_failure)   # export/parity.py

The held-out sources run as one batch through beam search (beam IN_PLACE_PARITY_BEAM, every
hypothesis returned) twice: on the precision's two-graph loop with `decoder.onnx`, and with
the in-place decoder, whose hypotheses are reordered by cache indirection, whose finished
inputs leave by moving rows inside the buffers and whose first step repeats each input's
row. fp32 must give the same token ids for every hypothesis and scores within
TOLERANCE_FP32 or, past it, within the bound of the model's own float32 logits error
(float64_noise.py `bound_of`, a score being a mean log-probability); int8 and fp16 are
reported, not gated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.kinds.in_place import InPlaceStep
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import beam_search

from ...parity import TOLERANCE_FP32, parity_group
from .float64_noise import ModelNoise, bound_of
from .parity import cpu_session, open_engine
from .precisions import GRAPH_FILES

IN_PLACE_PARITY_ROWS = 16  # sources in the batch
IN_PLACE_PARITY_BEAM = 4

Progress = Callable[[str], None]


def compare_precision(
    directory: Path,
    config: ModelConfig,
    precision: str,
    sources: Sequence[Sequence[int]],
    max_new_tokens: int | None,
) -> dict[str, Any]:
    """The numbers of one precision: beam search with its in-place decoder vs decoder.onnx."""
    engine = open_engine(*(directory / g for g in GRAPH_FILES[precision]), config)
    in_place = InPlaceStep(
        engine.encoder, cpu_session(directory / C.IN_PLACE_FILES[precision]), config
    )
    src_ids = right_pad(sources, config.pad_id)
    beam = IN_PLACE_PARITY_BEAM
    want = beam_search(engine, src_ids, beam, max_new_tokens, n_best=beam)
    got = beam_search(in_place, src_ids, beam, max_new_tokens, n_best=beam)
    rows = list(zip(want, got, strict=True))
    pairs = [(a, b) for row_a, row_b in rows for a, b in zip(row_a, row_b, strict=False)]
    same = sum([h.tokens for h in a] == [h.tokens for h in b] for a, b in rows)
    return {
        "rows": len(sources),
        "beam": beam,
        "hypotheses": sum(len(row) for row in want),
        "identical_rows": int(same),
        "max_score_diff": max((abs(a.score - b.score) for a, b in pairs), default=0.0),
    }


def in_place_parity_group(
    directory: Path,
    config: ModelConfig,
    precisions: Sequence[str],
    sources: Sequence[Sequence[int]],
    max_new_tokens: int | None = None,
    progress: Progress | None = None,
    noise: ModelNoise | None = None,
) -> dict[str, Any]:
    """The report's "inplace" group for `precisions` (fp32 first) on the first
    IN_PLACE_PARITY_ROWS `sources`; fp32 passes with identical hypotheses and scores within
    TOLERANCE_FP32, or past it within the bound of `noise` (None: the tolerance)."""
    sources = list(sources)[:IN_PLACE_PARITY_ROWS]

    def fp32_passed(fp32: dict[str, Any]) -> bool:
        fp32 |= bound_of(fp32["max_score_diff"], noise, "scores")
        same = fp32["identical_rows"] == len(sources)
        return same and fp32["max_score_diff"] <= fp32["bound"]

    return parity_group(
        precisions,
        lambda p: compare_precision(directory, config, p, sources, max_new_tokens),
        fp32_passed,
        lambda p: f"parity inplace ({p}): beam {IN_PLACE_PARITY_BEAM} on {len(sources)} rows",
        progress,
        tolerance=TOLERANCE_FP32,
    )


def in_place_failure(group: dict[str, Any]) -> str:
    """The ParityError message of a failed "inplace" group."""
    fp32 = group["fp32"]
    return (
        f"the in-place cache decoder's beam search differs from decoder.onnx's: identical "
        f"hypotheses on {fp32['identical_rows']}/{fp32['rows']} inputs, max |Δscore| "
        f"{fp32['max_score_diff']:.2e} (bound {fp32.get('bound', group['tolerance']):.2g}); "
        "re-export without the inplace variant"
    )
