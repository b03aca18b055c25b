"""Parity of the step-batching decoder: rows at different positions in one batch give the
logits each row gives alone through `decoder.onnx`.

    group = steps_parity_group(directory, config, ["fp32", "int8"], sources, print)
    check_group({"steps": group}, "steps", steps_failure)   # export/parity.py

Each source is first decoded alone (batch 1, greedy) with the precision's `decoder.onnx`,
keeping the logits of every step. Then all sources run as one batch through the steps graph,
row r joining at step `join[r]` (so rows sit at different positions), fed the tokens of its
solo run: before it joins and after it ends a row feeds `<pad>` at position 0 and sees only
that slot, so its cache holds slots it must never see again, which its tgt_mask hides. Each
live row's logits are compared with its solo logits at the same position. fp32 must agree
within TOLERANCE_FP32 or, past it, within the bound of the model's own float32 logits error
(float64_noise.py: two graphs, each that far from the exact result); int8 quantizes
activations per tensor over the batch and fp16 rounds differently with the batch's shapes, so
their numbers (max |Δ| and arg-max agreement) are
reported, not gated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.kinds.seq2seq import OrtStep
from edgeseq.runtime.padding import right_pad

from ...parity import TOLERANCE_FP32, parity_group
from .float64_noise import ModelNoise, bound_of
from .parity import cpu_session, open_engine
from .precisions import GRAPH_FILES

STEPS_PARITY_ROWS = 8  # sources in the staggered batch
STEPS_PARITY_STEPS = 12  # solo steps per source at most

Progress = Callable[[str], None]


def solo_logits(engine: OrtStep, source: Sequence[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy decoding of one source alone: the ids fed (`<s>` first) and the logits of every
    step, (T, V) float32; stops after `</s>` or `steps` steps."""
    state = engine.start(np.array([source], dtype=np.int64))
    fed, logits = [engine.bos_id], []
    for _ in range(min(steps, engine.max_len)):
        out, state = engine.step(state, np.array([[fed[-1]]], dtype=np.int64))
        logits.append(out[0, -1])
        token = int(out[0, -1].argmax())
        if token == engine.eos_id:
            break
        fed.append(token)
    return fed[: len(logits)], np.stack(logits)


def staggered_logits(
    engine: OrtStep,
    steps_session: ort.InferenceSession,
    sources: Sequence[Sequence[int]],
    fed: Sequence[Sequence[int]],
    join: Sequence[int],
) -> list[np.ndarray]:
    """Per row, the steps graph's logits (T_r, V) of its live steps, all rows in one batch:
    row r joins at step join[r] and feeds fed[r] at positions 0, 1, ..."""
    rows, layers = len(sources), engine.layers
    src_ids = right_pad(sources, engine.pad_id)
    out = engine.encoder.run(list(engine.encoder_outputs[1:]), {C.SRC_IDS: src_ids})
    feeds: dict[str, np.ndarray] = dict(zip(engine.names[C.CROSS_K], out[:layers], strict=True))
    feeds |= dict(zip(engine.names[C.CROSS_V], out[layers:], strict=True))
    feeds[C.SRC_MASK] = src_ids != engine.pad_id
    cfg = engine.config
    past = [np.zeros((rows, cfg.n_heads, 0, cfg.d_head), engine.cache_dtype)] * (2 * layers)
    past_names = [*engine.names[C.PAST_K], *engine.names[C.PAST_V]]
    got: list[list[np.ndarray]] = [[] for _ in range(rows)]
    for t in range(max(j + len(f) for j, f in zip(join, fed, strict=True))):
        live = [join[r] <= t < join[r] + len(fed[r]) for r in range(rows)]
        ids = [fed[r][t - join[r]] if live[r] else engine.pad_id for r in range(rows)]
        positions = [t - join[r] if live[r] else 0 for r in range(rows)]
        slots = np.arange(t + 1)[None, :]  # (1, t+1)
        start = np.array([join[r] if live[r] else t for r in range(rows)])[:, None]
        feeds |= dict(zip(past_names, past, strict=True))
        feeds[C.INPUT_IDS] = np.array(ids, dtype=np.int64)[:, None]
        feeds[C.POSITION_IDS] = np.array(positions, dtype=np.int64)[:, None]
        feeds[C.TGT_MASK] = slots >= start  # (B, t+1)
        logits, *past = steps_session.run(list(engine.decoder_outputs), feeds)
        for r in range(rows):
            if live[r]:
                got[r].append(logits[r, -1])
    return [np.stack(g) for g in got]


def compare_precision(
    directory: Path, config: ModelConfig, precision: str, sources: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """The numbers of one precision: its steps graph in a staggered batch against its
    decoder.onnx row by row (see the module docstring)."""
    engine = open_engine(*(directory / g for g in GRAPH_FILES[precision]), config)
    session = cpu_session(directory / C.STEPS_FILES[precision])
    solo = [solo_logits(engine, s, STEPS_PARITY_STEPS) for s in sources]
    fed = [f for f, _ in solo]
    join = [(3 * r) // 2 for r in range(len(sources))]  # 0, 1, 3, 4, 6, ...: pairs and gaps
    batched = staggered_logits(engine, session, sources, fed, join)
    diff = max(float(np.abs(b - a).max()) for (_, a), b in zip(solo, batched, strict=True))
    same = sum(
        np.array_equal(a.argmax(-1), b.argmax(-1)) for (_, a), b in zip(solo, batched, strict=True)
    )
    return {
        "rows": len(sources),
        "join_steps": join,
        "positions": int(sum(len(f) for f in fed)),
        "max_abs_diff": diff,
        "argmax_identical_rows": int(same),
    }


def steps_parity_group(
    directory: Path,
    config: ModelConfig,
    precisions: Sequence[str],
    sources: Sequence[Sequence[int]],
    progress: Progress | None = None,
    noise: ModelNoise | None = None,
) -> dict[str, Any]:
    """The report's "steps" group for `precisions` (fp32 first) on the first
    STEPS_PARITY_ROWS `sources`; fp32 passes with the same arg-max within TOLERANCE_FP32, or
    past it within the bound of `noise` (the model's float32 error; None: the tolerance)."""
    sources = list(sources)[:STEPS_PARITY_ROWS]

    def fp32_passed(fp32: dict[str, Any]) -> bool:
        fp32 |= bound_of(fp32["max_abs_diff"], noise)
        same = fp32["argmax_identical_rows"] == len(sources)
        return same and fp32["max_abs_diff"] <= fp32["bound"]

    return parity_group(
        precisions,
        lambda precision: compare_precision(directory, config, precision, sources),
        fp32_passed,
        lambda precision: (
            f"parity steps ({precision}): {len(sources)} rows at different positions vs alone"
        ),
        progress,
        tolerance=TOLERANCE_FP32,
    )


def steps_failure(group: dict[str, Any]) -> str:
    """The ParityError message of a failed "steps" group."""
    fp32 = group["fp32"]
    return (
        f"the step-batching decoder differs from decoder.onnx: max |Δlogit| "
        f"{fp32['max_abs_diff']:.2e} (bound {fp32.get('bound', group['tolerance']):.2g}), "
        f"arg-max identical "
        f"on {fp32['argmax_identical_rows']}/{fp32['rows']} rows; re-export with --no-fuse, "
        "or without the steps variant"
    )
