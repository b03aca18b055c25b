"""Parity levels 1-3 on the session's exported bundles, and ParityError on a wrong graph."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from edgeseq.export.kinds.seq2seq.parity import (
    LEVEL3_BATCH,
    LEVEL3_BEAM_INPUTS,
    open_engine,
    parity_batch,
    run_parity,
)
from edgeseq.export.kinds.seq2seq.parity_graphs import decoder_feeds
from edgeseq.export.kinds.seq2seq.source_parity import LOGIT_CHUNK_BYTES, logit_chunks
from edgeseq.export.limits import LEVEL3_MIN_INPUTS
from edgeseq.export.parity import TOLERANCE_FP32, check_parity, random_sources
from edgeseq.export.report import format_parity
from edgeseq.runtime import constants as C
from edgeseq.runtime.errors import ParityError


def _engine(case):
    return open_engine(case.bundle / C.ENCODER_FILE, case.bundle / C.DECODER_FILE, case.model.cfg)


def test_export_report_passes_all_three_levels(export_case) -> None:
    report = export_case.manifest["parity"]
    assert report["passed"] and report["tolerance"] == TOLERANCE_FP32
    level1, level2, level3 = report["level1"], report["level2"], report["level3"]
    assert set(level1["max_abs_diff"]) == set(C.ENCODER_FAMILIES + C.DECODER_FAMILIES)
    assert max(level1["max_abs_diff"].values()) <= TOLERANCE_FP32
    assert level1["encoder_cases"] == 6 and level1["decoder_cases"] == 36  # batch 1/3 ...
    assert level2["steps"] >= 20 and level2["max_abs_diff_cached"] <= TOLERANCE_FP32
    assert 0 < level2["live_steps"] <= level2["rows"] * level2["steps"]
    drift = level2["torch_cached_vs_uncached"]
    assert level2["bound"] == pytest.approx(TOLERANCE_FP32 + drift)
    assert level2["max_abs_diff_uncached"] <= level2["bound"]
    assert level3["inputs"] == level3["identical"] == LEVEL3_MIN_INPUTS
    assert level3["beam"]["inputs"] == level3["beam"]["identical"] == LEVEL3_BEAM_INPUTS
    assert export_case.manifest["variants"]["fp32"]["verified"] is True


def test_parity_reruns_on_the_written_bundle(export_case) -> None:
    sources = random_sources(export_case.model, 40, seed=7)
    report = run_parity(export_case.model, _engine(export_case), sources, max_new_tokens=12)
    check_parity(report)  # does not raise
    table = format_parity(report)
    assert "decoder logits" in table and "40/40" in table and "parity passed" in table
    assert "identical beam-4 best hypotheses (first 40)" in table


def test_a_wrong_decoder_weight_raises_parity_error_with_numbers(export_case) -> None:
    model = copy.deepcopy(export_case.model)
    with torch.no_grad():
        # One entry only: a uniform shift of the bias would vanish in a post-norm LayerNorm.
        model.decoder_layers[0].ffn.w_2.bias[0] += 0.05  # the graph keeps the exported value
    report = run_parity(model, _engine(export_case), random_sources(model, 8), max_new_tokens=8)
    with pytest.raises(ParityError, match=r"level 1 max \|Δ\| above 1e-04: .*logits") as info:
        check_parity(report)
    diffs = info.value.report["level1"]["max_abs_diff"]
    assert diffs["logits"] > TOLERANCE_FP32
    assert diffs["memory"] <= TOLERANCE_FP32  # the encoder was not touched
    level2 = info.value.report["level2"]
    assert not level2["passed"] and level2["max_abs_diff_uncached"] > level2["bound"]
    assert level2["max_abs_diff_cached"] > level2["bound"]
    assert level2["torch_cached_vs_uncached"] < TOLERANCE_FP32  # PyTorch agrees with itself
    assert "FAIL" in format_parity(info.value.report)


def test_a_level3_mismatch_names_the_first_divergent_step(export_case) -> None:
    """PyTorch is made to prefer token 7 everywhere: every sequence differs at step 0 and
    the report shows both engines' top-2 logits there."""
    model = copy.deepcopy(export_case.model)
    bump = torch.zeros(model.cfg.tgt_vocab_size)
    bump[7] = 100.0
    model.output.register_forward_hook(lambda module, args, out: out + bump)
    sources = random_sources(model, 10)
    report = run_parity(model, _engine(export_case), sources, max_new_tokens=6)
    level3 = report["level3"]
    assert level3["identical"] == 0 and not level3["passed"]
    first = level3["mismatches"][0]
    assert first["step"] == 0 and first["torch_ids"] == [7] * 6
    assert first["torch_top2"][0][0] == 7 and first["torch_top2"][0][1] > 50
    assert first["onnx_top2"][0][1] < 50 and first["source_ids"] == sources[0]
    assert level3["beam"]["identical"] == 0 and level3["beam"]["mismatches"][0]["index"] == 0
    with pytest.raises(ParityError, match=r"level 3 0/10 .* first differs at step 0"):
        check_parity(report)


@pytest.mark.parametrize("past_len", [0, 9])
def test_level1_decoder_feeds_are_states_the_model_makes(export_case, past_len: int) -> None:
    """Cross/past K/V come from PyTorch's own encoder and decoder: shapes, dtypes, a mask
    whose first row and column are real."""
    model, cfg = export_case.model, export_case.model.cfg
    feeds = decoder_feeds(model, np.random.default_rng(3), 3, 7, past_len, 4)
    layers = cfg.n_decoder_layers
    assert set(feeds) == set(C.decoder_inputs(layers))
    for name in C.layer_names(C.PAST_K, layers) + C.layer_names(C.PAST_V, layers):
        assert feeds[name].shape == (3, cfg.n_heads, past_len, cfg.d_head)
        assert feeds[name].dtype == np.float32
    for name in C.layer_names(C.CROSS_K, layers) + C.layer_names(C.CROSS_V, layers):
        assert feeds[name].shape == (3, cfg.n_heads, 7, cfg.d_head)
        assert np.isfinite(feeds[name]).all() and np.abs(feeds[name]).max() > 0
    assert feeds[C.INPUT_IDS].dtype == np.int64
    mask = feeds[C.SRC_MASK]
    assert mask.dtype == bool and mask.shape == (3, 7) and mask[0].all() and mask[:, 0].all()
    # layers differ: each is its own layer's projection, not one tensor repeated
    if layers > 1:
        assert not np.array_equal(feeds[f"{C.CROSS_K}.0"], feeds[f"{C.CROSS_K}.1"])


def test_level2_bound_covers_cached_logits_and_older_manifests_read() -> None:
    """Level 2's `bound` (tolerance + PyTorch's own drift) judges the cached comparison too; a
    manifest written before it (`uncached_bound`, the shipped g2p-en's) judges cached logits by
    the tolerance alone."""
    import json
    from pathlib import Path

    shipped = Path(C.__file__).parent / "models" / "g2p-en" / "manifest.json"
    report = json.loads(shipped.read_text(encoding="utf-8"))["parity"]
    level2 = report["level2"]
    assert "uncached_bound" in level2 and "bound" not in level2
    assert "FAIL" not in format_parity(report)
    drift = TOLERANCE_FP32 / 2  # a cached difference within tolerance + drift, over tolerance
    old = level2 | {"max_abs_diff_cached": TOLERANCE_FP32 * 1.2}
    assert "FAIL" in format_parity(report | {"level2": old})
    new = {k: v for k, v in old.items() if k != "uncached_bound"}
    new |= {"torch_cached_vs_uncached": drift, "bound": TOLERANCE_FP32 + drift}
    assert "FAIL" not in format_parity(report | {"level2": new})


def test_parity_batches_shrink_only_for_vocabulary_sized_logits() -> None:
    assert parity_batch(58_101) == parity_batch(58_101, 4) == LEVEL3_BATCH  # opus-mt
    assert parity_batch(32_128, 4) == LEVEL3_BATCH  # T5
    assert parity_batch(256_206) == LEVEL3_BATCH  # NLLB-200 greedy: 64 rows would fit
    assert parity_batch(256_206, 4) == 16  # beam 4: 64 rows of 1 MB of logits
    assert parity_batch(10**9, 4) == 1


def test_logit_chunks_cover_every_row_in_order_within_the_budget() -> None:
    vocab = 256_206
    fed = [[1] * n for n in (3, 17, 5, 17, 2, 9, 17, 1)]
    chunks = logit_chunks(fed, vocab)
    assert [i for chunk in chunks for i in chunk] == list(range(len(fed)))
    for chunk in chunks:
        width = max(len(fed[i]) for i in chunk)
        assert len(chunk) == 1 or len(chunk) * width * vocab * 4 <= LOGIT_CHUNK_BYTES
    assert len(chunks) > 1
    assert logit_chunks(fed, 100) == [list(range(len(fed)))]  # a small vocabulary: one chunk
