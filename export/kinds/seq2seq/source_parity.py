"""Parity against the source model itself: an imported model's fp32 graphs vs the original
module (the user's `torch.nn.Transformer` parts, `MarianMTModel`), in edgeseq ids.

    group = source_parity(reference, engine, held, cfg, max_new_tokens, drift, noise)
    check_group(report, "source", source_failure)            # export/parity.py: ParityError

The adapter's weight map is thereby proven, not assumed. The source runs its own code
(`SourceReference.logits`: a full, uncached forward) and, where it has one, its own search
(`SourceReference.generate`: e.g. `MarianMTModel.generate`); `ReferenceStep` drives its
forward from runtime/search.py where it has none (greedy or beam over a full re-decode).

1. logits: both graphs in one decoder call (past 0, every target position at once) vs the
   source's forward, teacher-forced with the graphs' greedy output, at every real position;
2. per step: the cached decoder's logits along that greedy decode vs the same forward;
   both within the tolerance plus `drift`, PyTorch's own cached-vs-uncached difference on
   the same weights (level 2 of edgeseq's parity: e.g. 6e-5 for a T5 whose logits reach
   ±200), or past that within the bound of the model's own float32 error on the same
   positions (float64_noise.py `ModelNoise`: a T5 v1.1 with logits in the hundreds differs
   from its float64 self by 1e-2 and more, and the source's float32 run as much);
3. sequences: the graphs' greedy and beam-4 ids vs the source's own generation, with the
   first divergent step and both engines' top-2 logits. A divergence where the source's
   top-2 logits are closer than the logits bound (level 1's: the tolerance, or the model's
   float32 error past it) is reported as a near tie: the two engines agree within the
   bound, and the choice between tied tokens is arbitrary.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.prefix import forced
from edgeseq.runtime.search import beam_search, greedy_search
from edgeseq.runtime.step import StepModel

from ...heldout import HeldOut
from ...parity import (
    MAX_REPORTED_MISMATCHES,
    NOISE_FACTOR,
    TOLERANCE_FP32,
    max_abs_diff,
    single_thread,
    top2,
)
from ...sources import SourceReference
from .float64_noise import ModelNoise, noise_bound
from .parity import LEVEL3_BEAM_INPUTS, LEVEL3_BEAM_SIZE

LOGIT_ROWS = 16  # held-out inputs compared at levels 1 and 2
LOGIT_CHUNK_BYTES = 32 * 2**20  # float32 logits of the rows compared at once (logit_chunks)
BATCH = 16


@dataclass(frozen=True)
class ReferenceState:
    """The sources int64 (B, S) and the target tokens fed so far int64 (B, T)."""

    src: np.ndarray
    tokens: np.ndarray

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.src.shape[0])

    @property
    def past_len(self) -> int:
        """Target positions fed so far."""
        return int(self.tokens.shape[1])


class ReferenceStep:
    """A `SourceReference` as a `StepModel`: every step re-runs the source's full forward
    over the tokens so far (no cache), so search runs on the source's own arithmetic."""

    def __init__(self, reference: SourceReference, config: ModelConfig) -> None:
        self.reference = reference
        self.max_len, self.vocab_size = config.max_len, config.tgt_vocab_size
        self.bos_id, self.eos_id, self.pad_id = config.bos_id, config.eos_id, config.pad_id
        # tokens the source forces first (a target language), forced in edgeseq's search too
        self.target_prefix = tuple(getattr(reference, "target_prefix", ()))

    def start(self, src_ids: np.ndarray) -> ReferenceState:
        """Remember the sources int64 (B, S); no token fed yet."""
        src = np.asarray(src_ids, dtype=np.int64)
        return ReferenceState(src, np.zeros((src.shape[0], 0), dtype=np.int64))

    @torch.inference_mode()
    def step(
        self, state: ReferenceState, input_ids: np.ndarray
    ) -> tuple[np.ndarray, ReferenceState]:
        """input_ids int64 (B, N) -> the source's logits float32 (B, N, V) at those positions."""
        tokens = np.concatenate([state.tokens, np.asarray(input_ids, dtype=np.int64)], axis=1)
        logits = self.reference.logits(torch.from_numpy(state.src), torch.from_numpy(tokens))
        new = input_ids.shape[1]
        return logits[:, -new:].float().numpy(), ReferenceState(state.src, tokens)

    def select(self, state: ReferenceState, rows: np.ndarray) -> ReferenceState:
        """A state of batch rows `rows` (int64 (B',), may repeat)."""
        idx = np.asarray(rows, dtype=np.int64)
        return ReferenceState(state.src[idx], state.tokens[idx])


def _logit_levels(
    reference: ReferenceStep,
    engine: StepModel,
    sources: Sequence[Sequence[int]],
    limit: int,
    drift: float,
    noise: ModelNoise | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Levels 1 (one call over every position) and 2 (cached steps) on `sources`, each
    within the tolerance + `drift`, or past it within `noise`'s bound on these positions.
    The logits are compared a few rows at a time (`logit_chunks`)."""
    src_all = right_pad(sources, engine.pad_id)
    greedy = greedy_search(forced(engine, [reference.target_prefix]), src_all, limit)
    fed_all = [[engine.bos_id, *ids][: engine.max_len] for ids in greedy]  # what search fed
    level1 = level2 = 0.0
    chunks, positions = [], 0
    for rows in logit_chunks(fed_all, engine.vocab_size):
        src = right_pad([sources[i] for i in rows], engine.pad_id)
        fed = [fed_all[i] for i in rows]
        tgt_in = right_pad(fed, engine.pad_id)
        real = np.arange(tgt_in.shape[1])[None, :] < np.array([len(f) for f in fed])[:, None]
        want, _ = reference.step(reference.start(src), tgt_in)  # (B, T, V)
        whole, _ = engine.step(engine.start(src), tgt_in)
        level1 = max(level1, max_abs_diff(whole[real], want[real]))
        del whole
        state = engine.start(src)
        for t in range(tgt_in.shape[1]):
            logits, state = engine.step(state, tgt_in[:, t : t + 1])
            level2 = max(level2, max_abs_diff(logits[:, 0][real[:, t]], want[:, t][real[:, t]]))
        chunks.append((src, tgt_in, real))
        positions += int(real.sum())
    bound = TOLERANCE_FP32 + drift
    info = {"inputs": len(sources), "positions": positions, "tolerance": TOLERANCE_FP32}
    info["torch_cached_vs_uncached"] = drift
    if max(level1, level2) > bound and noise is not None:  # PyTorch's own float32 error
        error = max(noise.at(*chunk) for chunk in chunks)
        bound = max(bound, noise_bound(error))
        info |= {"float64_noise": error, "noise_factor": NOISE_FACTOR}
    info["bound"] = bound
    return (
        info | {"max_abs_diff": level1, "passed": level1 <= bound},
        info | {"max_abs_diff": level2, "passed": level2 <= bound},
    )


def logit_chunks(fed: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    """Row indices of `fed` (target prefixes) in consecutive chunks whose float32 logits over
    every position (rows x longest prefix x `vocab_size`) stay within LOGIT_CHUNK_BYTES (at
    least one row each): a level-1 comparison holds several copies of them, and 16 rows of
    17 positions over NLLB-200's 256,206 rows are 279 MB per copy."""
    chunks: list[list[int]] = []
    for index in range(len(fed)):
        rows = [*chunks[-1], index] if chunks else [index]
        width = max(len(fed[i]) for i in rows)
        if chunks and len(rows) * width * vocab_size * 4 <= LOGIT_CHUNK_BYTES:
            chunks[-1] = rows
        else:
            chunks.append([index])
    return chunks


def _divergence(
    reference: ReferenceStep,
    engine: StepModel,
    source: Sequence[int],
    want: list,
    have: list,
    tie_bound: float = TOLERANCE_FP32,
) -> dict[str, Any]:
    """The first step where `want` (source) and `have` (graphs) differ, with both engines'
    top-2 logits after the common prefix, and whether the source's top two are a near tie
    (within `tie_bound`)."""
    common = min(len(want), len(have))
    step = next((i for i in range(common) if want[i] != have[i]), common)
    prefix = np.array([[engine.bos_id, *want[:step]]], dtype=np.int64)
    src = np.array([list(source)], dtype=np.int64)
    tops = [top2(m.step(m.start(src), prefix)[0][0, -1]) for m in (reference, engine)]
    tie = abs(tops[0][0][1] - tops[0][1][1]) <= tie_bound
    return {"step": step, "source_top2": tops[0], "onnx_top2": tops[1], "near_tie": tie}


def _sequences(
    reference: ReferenceStep,
    engine: StepModel,
    sources: Sequence[Sequence[int]],
    beam_size: int,
    limit: int,
    tie_bound: float = TOLERANCE_FP32,
) -> dict[str, Any]:
    """The graphs' best ids vs the source's own generation (or its forward driven by our
    search) at `beam_size` on `sources`; a divergence within `tie_bound` is a near tie."""
    identical, ties, mismatches, own = 0, 0, [], None
    for start in range(0, len(sources), BATCH):
        chunk = [list(s) for s in sources[start : start + BATCH]]
        src = right_pad(chunk, engine.pad_id)
        want = reference.reference.generate(chunk, beam_size, limit)
        own = want is not None
        if want is None:
            want = _best(reference, src, beam_size, limit, reference.target_prefix)
        have = _best(engine, src, beam_size, limit, reference.target_prefix)
        for offset, (a, b) in enumerate(zip(want, have, strict=True)):
            if list(a) == list(b):
                identical += 1
                continue
            entry = _divergence(reference, engine, chunk[offset], list(a), list(b), tie_bound)
            ties += entry["near_tie"]
            if len(mismatches) < MAX_REPORTED_MISMATCHES:
                ids = {"source_ids": chunk[offset], "expected": list(a), "onnx_ids": list(b)}
                mismatches.append({"index": start + offset, **ids, **entry})
    total = len(sources)
    return {
        "beam_size": beam_size,
        "source_search": "the source's own generate" if own else "edgeseq search on its forward",
        "inputs": total,
        "identical": identical,
        "near_ties": ties,
        "passed": total > 0 and identical + ties == total,
        "mismatches": mismatches,
    }


def _best(
    model: StepModel, src: np.ndarray, beam_size: int, limit: int, prefix: tuple[int, ...]
) -> list[list[int]]:
    model = forced(model, [prefix])
    if beam_size == 1:
        return greedy_search(model, src, limit)
    return [list(h[0].tokens) for h in beam_search(model, src, beam_size, limit)]


def source_parity(
    reference: SourceReference,
    engine: StepModel,
    held: HeldOut,
    config: ModelConfig,
    max_new_tokens: int | None = None,
    drift: float = 0.0,
    noise: ModelNoise | None = None,
) -> dict[str, Any]:
    """The "source" parity group of the manifest: levels 1-3 of `engine` (the fp32 graphs)
    against the source model on the held-out inputs (see the module docstring); `drift`:
    PyTorch's own cached-vs-uncached difference, added to the logits tolerance; `noise`: the
    mapped model's float32 error, the bound past that (None: the tolerance + `drift` only)."""
    start = time.perf_counter()
    step = ReferenceStep(reference, config)
    limit = max_new_tokens if max_new_tokens is not None else config.max_len
    with torch.inference_mode(), single_thread():  # as levels 1-3: 75 s -> 4 s on 2 busy cores
        level1, level2 = _logit_levels(step, engine, held.sources[:LOGIT_ROWS], limit, drift, noise)
        ties = level1["bound"]
        greedy = _sequences(step, engine, held.sources, 1, limit, ties)
        firsts = held.sources[:LEVEL3_BEAM_INPUTS]
        beam = _sequences(step, engine, firsts, LEVEL3_BEAM_SIZE, limit, ties)
    level3 = {"source": held.description, "max_new_tokens": limit, "greedy": greedy, "beam": beam}
    level3["passed"] = greedy["passed"] and beam["passed"]
    return {
        "passed": level1["passed"] and level2["passed"] and level3["passed"],
        "level1": level1,
        "level2": level2,
        "level3": level3,
        "seconds": round(time.perf_counter() - start, 2),
    }


def source_failure(group: dict[str, Any]) -> str:
    """The ParityError message of a failed "source" group."""
    failed = [name for name in ("level1", "level2", "level3") if not group[name]["passed"]]
    return (
        f"the bundle does not reproduce the source model ({', '.join(failed)} failed: "
        f"logits max |diff| {group['level1']['max_abs_diff']:.2e} / "
        f"{group['level2']['max_abs_diff']:.2e}, greedy identical "
        f"{group['level3']['greedy']['identical']}/{group['level3']['greedy']['inputs']}); "
        "the model does not map onto edgeseq's blocks as the adapter assumed: report it"
    )
