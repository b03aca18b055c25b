"""OrtStep.select: beam reordering within each input keeps the cross K/V, other selections
gather them; either way the state equals a plain gather of every array."""

from __future__ import annotations

import numpy as np

from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.kinds.ort_step import OrtState, OrtStep


def _step(bundle) -> OrtStep:
    checked = load_bundle(bundle)
    return OrtStep.from_files(*checked.graphs("fp32"), checked.config)


def _plain(state: OrtState, rows: np.ndarray) -> list[np.ndarray]:
    arrays = [*state.cross_k, *state.cross_v, state.src_mask, *state.past_k, *state.past_v]
    return [a[rows] for a in arrays]


def _arrays(state: OrtState) -> list[np.ndarray]:
    return [*state.cross_k, *state.cross_v, state.src_mask, *state.past_k, *state.past_v]


def test_select_reuses_cross_kv_only_when_source_rows_are_unchanged(runtime_case) -> None:
    step = _step(runtime_case.bundle)
    src = np.array([[5, 6, 7, 2], [8, 9, 2, 0], [4, 2, 0, 0]], dtype=np.int64)
    state = step.start(src)
    beams = step.select(state, np.array([0, 0, 1, 1, 2, 2]))  # 2 beams per input
    assert beams.source_rows.tolist() == [0, 0, 1, 1, 2, 2]
    ids = np.array([[4], [5], [6], [7], [8], [9]], dtype=np.int64)
    _, beams = step.step(beams, ids)
    _, beams = step.step(beams, ids)
    reorder = np.array([1, 1, 3, 2, 4, 5])  # hypotheses move only within their input
    kept = step.select(beams, reorder)
    assert kept.cross_k[0] is beams.cross_k[0] and kept.src_mask is beams.src_mask
    for got, want in zip(_arrays(kept), _plain(beams, reorder), strict=True):
        np.testing.assert_array_equal(got, want)
    dropped = np.array([0, 1, 4, 4])  # input 1 finished: rows change source
    smaller = step.select(beams, dropped)
    assert smaller.source_rows.tolist() == [0, 0, 2, 2]
    assert smaller.cross_k[0] is not beams.cross_k[0]
    for got, want in zip(_arrays(smaller), _plain(beams, dropped), strict=True):
        np.testing.assert_array_equal(got, want)
    logits, _ = step.step(smaller, ids[:4])
    reference, _ = step.step(step.select(beams, dropped), ids[:4])
    np.testing.assert_array_equal(logits, reference)
