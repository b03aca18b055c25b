"""The in-place cache decoder (issue 38): `decoder.inplace.onnx` / `decoder.inplace.int8.onnx`,
its parity group, `InPlaceStep` (buffers written by the graph, beam reordering by cache
indirection, rows leaving by moves inside the buffers) against `OrtStep` on decoder.onnx, and the
generator's choice of step model. The buffer pool and the memory bounds:
tests/test_in_place_memory.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgeseq.export.heldout import HeldOut
from edgeseq.export.kinds.seq2seq.bundle import export_bundle
from edgeseq.export.report import format_parity
from edgeseq.export.variants import VariantOptions, parse_variants
from edgeseq.runtime import Generator
from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.kinds import in_place as in_place_module
from edgeseq.runtime.kinds.in_place import InPlaceStep
from edgeseq.runtime.search import GenerationOptions

TEXTS = ["abc", "jihgfedcba", "a", "bbbbbbbbbb", "cafe", "decade", "hij", "ab", "gggg", "fab"]


def test_export_writes_the_in_place_decoders_and_passes_parity(in_place_bundle) -> None:
    """fp32 and int8 files listed in the manifest with their extra inputs; the parity group
    gives identical fp32 beam hypotheses; the bundle loads (fingerprints checked)."""
    manifest = json.loads((in_place_bundle / C.MANIFEST_FILE).read_text())
    entry = manifest["inplace"]
    assert entry["fp32"]["file"] == C.IN_PLACE_FILES["fp32"]
    assert entry["int8"]["file"] == C.IN_PLACE_FILES["int8"]
    assert [spec["name"] for spec in entry["inputs"]] == [
        C.CACHE_MASK, C.PAST_LENGTH, C.BEAM_WIDTH, C.CACHE_INDIRECTION,
    ]  # fmt: skip
    shapes = {spec["name"]: spec["shape"] for spec in entry["inputs"]}
    assert shapes[C.CACHE_MASK] == [C.BATCH, C.ATTENDED_LEN]
    assert shapes[C.CACHE_INDIRECTION] == [C.INPUTS, C.BEAMS, C.CACHE_LEN]
    for precision in ("fp32", "int8"):
        assert (in_place_bundle / entry[precision]["file"]).stat().st_size > 0
    group = manifest["parity"]["inplace"]
    assert group["passed"] and group["fp32"]["identical_rows"] == group["fp32"]["rows"] > 0
    assert group["fp32"]["max_score_diff"] <= group["tolerance"]
    assert "int8" in group
    report = format_parity(manifest["parity"])
    assert "fp32 in-place decoder: identical beam-4 hypotheses" in report
    assert "int8 in-place decoder" in report
    load_bundle(in_place_bundle)
    assert "inplace" in parse_variants("int8,inplace")


def test_no_fuse_refuses_the_in_place_variant(runtime_model, tmp_path) -> None:
    """The in-place graph exists only with fused attention: refused before any export."""
    held = HeldOut([[4, 5, C.SPECIAL_TOKENS.index(C.EOS)]], None, "one source")
    with pytest.raises(OptionsError, match="--no-fuse"):
        export_bundle(
            runtime_model.model, runtime_model.tokenizers, tmp_path / "b", held=held,
            variants=VariantOptions(("fp32", "inplace")), fuse=False,
        )  # fmt: skip
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_generator_runs_beam_search_in_place(in_place_bundle, variant) -> None:
    """Beam search goes through InPlaceStep and gives the loop's hypotheses on decoder.onnx
    (fp32: identical ids, scores within 1e-4; int8 loads and runs); greedy stays on OrtStep."""
    gen = Generator.load(in_place_bundle, threads=1, variant=variant, search="loop")
    beam = GenerationOptions(beam_size=3, n_best=3, batch_size=4)
    assert isinstance(gen.loop_model(beam), InPlaceStep)
    assert not isinstance(gen.loop_model(GenerationOptions()), InPlaceStep)
    got = gen.generate(TEXTS, beam)
    gen._in_place = None  # the copying loop, for comparison
    want = gen.generate(TEXTS, beam)
    if variant == "fp32":
        for a, b in zip(got, want, strict=True):
            assert [c.token_ids for c in a.nbest] == [c.token_ids for c in b.nbest]
            assert np.allclose([c.score for c in a.nbest], [c.score for c in b.nbest], atol=1e-4)
    else:
        assert len(got) == len(TEXTS) and all(r.nbest for r in got)


def _steps(in_place_bundle):
    """OrtStep on decoder.onnx and InPlaceStep on decoder.inplace.onnx, sharing the encoder."""
    gen = Generator.load(in_place_bundle, threads=1, search="loop")
    ref = gen.step_model
    return gen, ref, InPlaceStep(ref.encoder, gen.in_place.decoder, gen.bundle.config)


SELECTIONS = [
    [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3],  # first beam step: each input's row three times
    [2, 0, 0, 3, 5, 4, 8, 6, 7, 9, 9, 11],  # in-block reordering (indirection only)
    [1, 2, 0, 5, 4, 3, 11, 11, 9],  # input 2 leaves, the others reorder: block moves
    [3, 4, 5, 6, 7, 8],  # input 0 leaves: the other blocks move down
    [5, 1, 1, 0],  # anything else: positions gathered through the indirection
    [3, 1],  # greedy-like: rows leave
]


@pytest.mark.parametrize("min_cache_len", [64, 2])
def test_select_paths_match_the_copying_step_model(in_place_bundle, monkeypatch, min_cache_len):
    """Every select path of InPlaceStep (in-block reorders, whole blocks kept, arbitrary
    gathers, buffers that must grow) gives the logits OrtStep gives on the same rows."""
    monkeypatch.setattr(in_place_module, "MIN_CACHE_LEN", min_cache_len)
    gen, ref, new = _steps(in_place_bundle)
    _check_select_paths(ref, new, gen._padded([gen.encode(t) for t in TEXTS[:4]]))


def _check_select_paths(ref, new, src) -> None:
    """Step model `new` through a step after each of SELECTIONS on sources src (4 rows) gives
    the logits `ref` gives on the same rows."""
    a, b = ref.start(src), new.start(src)
    rng = np.random.default_rng(0)
    ids = np.full((4, 1), ref.bos_id, np.int64)
    for rows in [None, *SELECTIONS]:
        if rows is not None:
            rows = np.array(rows, np.int64)
            a, b = ref.select(a, rows), new.select(b, rows)
            ids = rng.integers(len(C.SPECIAL_TOKENS), ref.vocab_size, (len(rows), 1))
        want, a = ref.step(a, ids)
        got, b = new.step(b, ids)
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) < 1e-4
        assert b.past_len == a.past_len and b.batch == a.batch


def test_graphs_with_cross_kv_per_row_still_run(in_place_bundle, runtime_model, tmp_path):
    """An in-place decoder exported with one cross K/V row per row (the layout before they
    were per input) runs in InPlaceStep and InPlaceDeviceStep through every select path,
    with the logits OrtStep gives; the current export takes them per input."""
    import onnxruntime as ort

    from edgeseq.export.kinds.seq2seq.in_place_graph import export_in_place_decoder
    from edgeseq.runtime.kinds.in_place import per_input_cross
    from edgeseq.runtime.kinds.in_place_device import InPlaceDeviceStep

    path = tmp_path / "decoder.inplace.per-row.onnx"
    export_in_place_decoder(runtime_model.model, path, per_input=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    gen, ref, current = _steps(in_place_bundle)
    assert per_input_cross(current.decoder) and not per_input_cross(session)
    src = gen._padded([gen.encode(t) for t in TEXTS[:4]])
    for new in (
        InPlaceStep(ref.encoder, session, gen.bundle.config),
        InPlaceDeviceStep(ref.encoder, session, gen.bundle.config, "cpu"),
    ):
        _check_select_paths(ref, new, src)


def test_step_refuses_more_than_one_new_token(in_place_bundle) -> None:
    gen, _, new = _steps(in_place_bundle)
    state = new.start(gen._padded([gen.encode("abc")]))
    with pytest.raises(ValueError, match="one new token"):
        new.step(state, np.array([[1, 4]], np.int64))


@torch.inference_mode()
def test_in_place_op_reference_writes_the_new_position(one_torch_thread) -> None:
    """The custom op's PyTorch reference (what the ONNX node stands for): the new key and
    value land at past_len, and attention reads each row's positions through the
    indirection."""
    from edgeseq.export.fused_ops import in_place_self_attention

    heads, d_head, width, past, length = 2, 4, 2, 3, 6
    rows = 2 * width
    torch.manual_seed(0)
    q, k, v = (torch.randn(rows, 1, heads * d_head) for _ in range(3))
    cache_k, cache_v = (torch.randn(rows, heads, length, d_head) for _ in range(2))
    indirection = torch.randint(0, width, (rows // width, width, length), dtype=torch.int32)
    keep = torch.ones(rows, past + 1, dtype=torch.int32)
    out, new_k, new_v = in_place_self_attention(
        q, k, v, keep, cache_k, cache_v, torch.tensor([past], dtype=torch.int32),
        torch.tensor([width], dtype=torch.int32), indirection, heads,
    )  # fmt: skip
    split = k.reshape(rows, heads, d_head)
    assert torch.equal(new_k[:, :, past], split)
    assert torch.equal(new_k[:, :, :past], cache_k[:, :, :past])
    assert torch.equal(new_v[:, :, past], v.reshape(rows, heads, d_head))
    r, h = 3, 1  # row 3 = input 1, beam 1
    held = [(r // width) * width + int(indirection[r // width, r % width, t]) for t in range(past)]
    keys = torch.stack([cache_k[held[t], h, t] for t in range(past)] + [split[r, h]])
    values = torch.stack(
        [cache_v[held[t], h, t] for t in range(past)] + [v.reshape(rows, heads, d_head)[r, h]]
    )
    query = q.reshape(rows, heads, d_head)[r, h]
    weights = torch.softmax(keys @ query / d_head**0.5, dim=0)
    assert torch.allclose(out.reshape(rows, heads, d_head)[r, h], weights @ values, atol=1e-6)
