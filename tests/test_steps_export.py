"""The step-batching decoder variant (issue 38 item 4): `decode_step` with per-row positions,
the exported `decoder.steps.onnx` / `decoder.steps.int8.onnx`, and its parity group: rows at
different positions in one batch give the logits each row gives alone through decoder.onnx."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import EXPORT_CONFIGS

from edgeseq.export.kinds.seq2seq.steps_parity import (
    STEPS_PARITY_ROWS,
    steps_failure,
    steps_parity_group,
)
from edgeseq.export.parity import check_group, random_sources
from edgeseq.export.variants import parse_variants
from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.errors import ParityError


@pytest.mark.parametrize("name", sorted(EXPORT_CONFIGS))
@torch.inference_mode()
def test_decode_step_with_positions_equals_each_row_alone(
    name, export_model_factory, one_torch_thread
) -> None:
    """Three rows with caches of 5, 2 and 0 real slots, left-padded with garbage slots, fed at
    positions 5, 2 and 0: each row's logits and new K/V are those it gets alone."""
    model = export_model_factory(name)[0]
    cfg = model.cfg
    torch.manual_seed(1)
    src = torch.randint(len(C.SPECIAL_TOKENS), cfg.src_vocab_size, (3, 6))
    src[1, 4:] = cfg.pad_id
    src_keep = model.source_keep(src)
    cross_k, cross_v = model.cross_kv(model.encode(src, src_keep))
    lengths, total = [5, 2, 0], 5
    tgt = torch.randint(len(C.SPECIAL_TOKENS), cfg.tgt_vocab_size, (3, total + 1))
    alone, past_k, past_v = [], [], []
    for r, length in enumerate(lengths):
        pk, pv = model.empty_cache(1, cross_k[0])
        cross = ([k[r : r + 1] for k in cross_k], [v[r : r + 1] for v in cross_v])
        if length:
            _, pk, pv = model.decode_step(
                tgt[r : r + 1, :length], pk, pv, *cross, src_keep[r : r + 1]
            )
        logits, k, v = model.decode_step(
            tgt[r : r + 1, length : length + 1], pk, pv, *cross, src_keep[r : r + 1]
        )
        alone.append((logits, k, v))
        garbage = torch.randn(1, cfg.n_heads, total - length, cfg.d_head)  # masked slots
        past_k.append([torch.cat([garbage, x], dim=2) for x in pk])
        past_v.append([torch.cat([garbage, x], dim=2) for x in pv])
    batch_k = [torch.cat([p[i] for p in past_k]) for i in range(cfg.n_decoder_layers)]
    batch_v = [torch.cat([p[i] for p in past_v]) for i in range(cfg.n_decoder_layers)]
    ids = torch.stack([tgt[r, length] for r, length in enumerate(lengths)])[:, None]
    positions = torch.tensor(lengths)[:, None]
    keep = torch.arange(total + 1)[None, :] >= (total - torch.tensor(lengths))[:, None]
    logits, k, v = model.decode_step(
        ids, batch_k, batch_v, cross_k, cross_v, src_keep, keep, positions
    )
    for r, (want, want_k, _) in enumerate(alone):
        assert torch.allclose(logits[r], want[0], atol=1e-5)
        assert torch.allclose(k[0][r, :, -1], want_k[0][0, :, -1], atol=1e-6)
    # the same rows without positions get positions 5, 5, 5: row 2 then differs
    wrong, _, _ = model.decode_step(ids, batch_k, batch_v, cross_k, cross_v, src_keep, keep)
    assert not torch.allclose(wrong[2], alone[2][0][0], atol=1e-3)


def test_steps_is_a_variant_name() -> None:
    assert parse_variants("steps,int8") == ("fp32", "int8", "steps")


def test_the_steps_graphs_are_listed_checked_and_their_parity_recorded(steps_bundle) -> None:
    manifest = json.loads((steps_bundle / C.MANIFEST_FILE).read_text())
    entry = manifest["steps"]
    assert entry["fp32"]["file"] == "decoder.steps.onnx" and entry["fused"] is True
    assert entry["int8"]["file"] == "decoder.steps.int8.onnx"
    assert [i["name"] for i in entry["inputs"]] == [C.POSITION_IDS, C.TGT_MASK]
    assert entry["inputs"][1]["shape"] == [C.BATCH, C.STEPS_TOTAL_LEN]
    for precision in ("fp32", "int8"):
        assert entry[precision]["file"] in manifest["files"]
    group = manifest["parity"]["steps"]
    assert group["passed"] and manifest["parity"]["passed"]
    assert group["fp32"]["max_abs_diff"] <= 1e-4
    assert group["fp32"]["argmax_identical_rows"] == group["fp32"]["rows"] == STEPS_PARITY_ROWS
    assert len(set(group["fp32"]["join_steps"])) == STEPS_PARITY_ROWS  # different positions
    assert "max_abs_diff" in group["int8"] and "passed" not in group["int8"]
    load_bundle(steps_bundle)  # checksums and vocabulary fingerprints, steps graphs included


class IgnoringMask:
    """A steps session that lets every row see every slot (the bug the parity must catch)."""

    def __init__(self, session) -> None:
        self.session = session

    def run(self, names, feeds):
        return self.session.run(names, feeds | {C.TGT_MASK: np.ones_like(feeds[C.TGT_MASK])})


def test_the_steps_parity_fails_when_the_mask_is_ignored(steps_bundle, monkeypatch) -> None:
    from edgeseq.export.kinds.seq2seq import steps_parity

    config = load_bundle(steps_bundle).config
    sources = random_sources_of(config, 8)
    group = steps_parity_group(steps_bundle, config, ["fp32"], sources)
    assert group["passed"] and group["fp32"]["max_abs_diff"] <= 1e-4
    real = steps_parity.cpu_session
    monkeypatch.setattr(steps_parity, "cpu_session", lambda path: IgnoringMask(real(path)))
    group = steps_parity_group(steps_bundle, config, ["fp32"], sources)
    assert not group["passed"] and group["fp32"]["max_abs_diff"] > 1e-3
    with pytest.raises(ParityError, match=r"step-batching decoder differs.*re-export"):
        check_group({"steps": group}, "steps", steps_failure)


def random_sources_of(config, n: int) -> list[list[int]]:
    """`n` random sources for a model of `config` (verify.random_sources wants the model)."""

    class Stub:
        cfg = config

    return random_sources(Stub(), n, seed=3)
