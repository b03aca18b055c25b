"""Decoder state that stays on the session's device (runtime/device_rows.py): the row gather
graph, and the IO-bound step models of both kinds that use it, run here on the CPU provider
with CPU OrtValues (the code CUDA runs). Their ids equal the numpy path's, and reordering
rows sends no cache through numpy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from host_transfers import count_transfers

from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.device_rows import ELEMENT_TYPES, DeviceRows, gather_model
from edgeseq.runtime.kinds.decoder_only import OrtBoundGPTStep, OrtGPTStep
from edgeseq.runtime.kinds.ort_step import OrtStep
from edgeseq.runtime.kinds.seq2seq import OrtBoundStep
from edgeseq.runtime.providers import CPU_EP, session_options
from edgeseq.runtime.search import GenerationOptions, search

CPU_ROWS = DeviceRows([CPU_EP], None, "cpu")
OPTIONS = (GenerationOptions(), GenerationOptions(beam_size=4, n_best=2))


def test_gather_graph_is_valid_onnx_and_gathers_every_dtype() -> None:
    onnx = pytest.importorskip("onnx")
    signature = [(ELEMENT_TYPES[t], rank) for t, rank in
                 (("tensor(float)", 4), ("tensor(float16)", 4), ("tensor(bool)", 2),
                  ("tensor(int64)", 1))]  # fmt: skip
    model = onnx.load_from_string(gather_model(signature))
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Gather"] * 4
    rng = np.random.default_rng(0)
    arrays = [
        rng.random((3, 2, 5, 4), dtype=np.float32),
        rng.random((3, 2, 0, 4)).astype(np.float16),  # an empty cache: zero positions
        rng.random((3, 7)) > 0.5,
        np.array([7, 8, 9], dtype=np.int64),
    ]
    for rows in ([2, 0, 0, 1], [1], [0, 1, 2]):
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
        got = CPU_ROWS.gather(values, np.array(rows))
        for array, value in zip(arrays, got, strict=True):
            assert value.device_name().lower() == "cpu"
            np.testing.assert_array_equal(value.numpy(), array[rows])
    assert len(CPU_ROWS._sessions) == 1  # one graph per signature, opened once
    CPU_ROWS.gather(values[:1], np.array([0]))
    assert len(CPU_ROWS._sessions) == 2
    assert CPU_ROWS.gather([], np.array([0])) == ()


def _seq2seq_steps(bundle: Path, variant: str) -> tuple[OrtStep, OrtBoundStep]:
    checked = load_bundle(bundle)
    options = session_options(threads=1)
    encoder, decoder = (
        ort.InferenceSession(str(path), options, providers=[CPU_EP])
        for path in checked.graphs(variant)
    )
    cfg = checked.config
    return OrtStep(encoder, decoder, cfg), OrtBoundStep(encoder, decoder, cfg, "cpu")


def _sources(step: OrtStep, n: int, seed: int) -> np.ndarray:
    """n random right-padded sources of ids 3..V-1 ending with </s>."""
    rng = np.random.default_rng(seed)
    vocab = step.config.src_vocab_size
    rows = [[*rng.integers(3, vocab, rng.integers(1, 12)), step.eos_id] for _ in range(n)]
    out = np.full((n, max(map(len, rows))), step.pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_bound_seq2seq_ids_equal_the_numpy_path(search_bundle: Path, variant: str) -> None:
    numpy_step, bound_step = _seq2seq_steps(search_bundle, variant)
    for start in range(0, 100, 25):
        src = _sources(numpy_step, 25, seed=start)
        for options in OPTIONS:
            got, want = search(bound_step, src, options), search(numpy_step, src, options)
            assert [[h.tokens for h in g] for g in got] == [[h.tokens for h in w] for w in want]
            np.testing.assert_allclose(
                [h.score for g in got for h in g], [h.score for w in want for h in w], atol=1e-5
            )


def test_bound_select_keeps_cross_kv_within_an_input_and_gathers_otherwise(
    runtime_case,
) -> None:
    numpy_step, bound_step = _seq2seq_steps(runtime_case.bundle, "fp32")
    src = np.array([[5, 6, 7, 2], [8, 9, 2, 0], [4, 2, 0, 0]], dtype=np.int64)
    ids = np.array([[4], [5], [6], [7], [8], [9]], dtype=np.int64)
    states = []
    for step in (numpy_step, bound_step):
        state = step.select(step.start(src), np.array([0, 0, 1, 1, 2, 2]))
        for _ in range(2):
            _, state = step.step(state, ids)
        states.append(state)
    host, bound = states
    assert bound.source_rows.tolist() == [0, 0, 1, 1, 2, 2]
    reorder = np.array([1, 1, 3, 2, 4, 5])  # hypotheses move only within their input
    kept = bound_step.select(bound, reorder)
    assert kept.cross_k[0] is bound.cross_k[0] and kept.src_mask is bound.src_mask
    assert kept.past_k[0] is not bound.past_k[0]
    dropped = np.array([0, 1, 4, 4])  # input 1 finished: rows change source
    smaller = bound_step.select(bound, dropped)
    assert smaller.source_rows.tolist() == [0, 0, 2, 2]
    want = numpy_step.select(host, dropped)
    for name in ("cross_k", "cross_v", "past_k", "past_v"):
        for value, array in zip(getattr(smaller, name), getattr(want, name), strict=True):
            assert value.device_name().lower() == "cpu"
            np.testing.assert_array_equal(value.numpy(), array)
    np.testing.assert_array_equal(smaller.src_mask.numpy(), want.src_mask)
    got, _ = bound_step.step(smaller, ids[:4])
    np.testing.assert_array_equal(got, numpy_step.step(want, ids[:4])[0])


def test_beam_search_moves_no_cache_through_numpy(runtime_case, monkeypatch) -> None:
    """Each step reads only the search's outputs from the device; select copies nothing to
    or from the host (the row indices are bound as a host input)."""
    _, bound_step = _seq2seq_steps(runtime_case.bundle, "fp32")
    src = _sources(bound_step, 6, seed=1)
    calls = count_transfers(monkeypatch, bound_step)
    search(bound_step, src, GenerationOptions(beam_size=4))
    assert calls["select"] >= calls["steps"] - 1 > 2  # a reorder after every step but the last
    assert calls["numpy"] == calls["steps"] * calls["heads"]  # only what the search reads
    assert calls["from_numpy"] == 1  # the source mask, once, at start


def _gpt_steps(bundle: Path, variant: str) -> tuple[OrtGPTStep, OrtBoundGPTStep]:
    checked = load_bundle(bundle)
    session = ort.InferenceSession(
        str(checked.model_graph(variant)), session_options(threads=1), providers=[CPU_EP]
    )
    return OrtGPTStep(session, checked.config), OrtBoundGPTStep(session, checked.config, "cpu")


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_bound_gpt_ids_equal_the_numpy_path(gpt_case: dict[str, Any], variant: str) -> None:
    numpy_step, bound_step = _gpt_steps(gpt_case["bundle"], variant)
    rng = np.random.default_rng(0)
    vocab = numpy_step.vocab_size
    prompts = [list(rng.integers(4, vocab, rng.integers(0, 6))) for _ in range(24)]
    padded = np.full((24, max(map(len, prompts))), numpy_step.pad_id, dtype=np.int64)
    for i, prompt in enumerate(prompts):
        padded[i, : len(prompt)] = prompt
    for options in OPTIONS:
        got, want = search(bound_step, padded, options), search(numpy_step, padded, options)
        assert [[h.tokens for h in g] for g in got] == [[h.tokens for h in w] for w in want]
    state = bound_step.select(bound_step.step(bound_step.start(padded), [[1]] * 24)[1], [3, 3])
    assert state.batch == 2 and state.past_k[0].device_name().lower() == "cpu"


# -- on a GPU (`pytest -m cuda`) ----------------------------------------------------------------
def _cuda_generator(bundle: Path) -> Any:
    """A strict-CUDA Generator of `bundle`, or a skip where CUDA does not load."""
    from edgeseq.runtime.errors import ProviderError
    from edgeseq.runtime.generator import Generator

    try:
        return Generator.load(bundle, providers="cuda")
    except ProviderError as exc:
        pytest.skip(f"no usable CUDA GPU on this machine: {exc}")


@pytest.mark.cuda
def test_cuda_reorder_keeps_the_state_on_the_gpu(search_bundle: Path) -> None:
    step = _cuda_generator(search_bundle).step_model
    assert isinstance(step, OrtBoundStep)
    state = step.select(step.start(np.array([[4, 5, 6, 2], [7, 2, 0, 0]])), np.array([0, 0, 1]))
    _, state = step.step(state, np.ones((3, 1), dtype=np.int64))
    state = step.select(state, np.array([1, 0, 2]))
    values = [*state.past_k, *state.past_v, *state.cross_k, *state.cross_v, state.src_mask]
    assert all(v.device_name().lower() == "cuda" for v in values)


@pytest.mark.cuda
def test_cuda_gpt_equals_cpu(gpt_case: dict[str, Any]) -> None:
    from edgeseq.runtime.generator import Generator

    gpu = _cuda_generator(gpt_case["bundle"])
    cpu = Generator.load(gpt_case["bundle"], providers="cpu")
    assert isinstance(gpu.step_model, OrtBoundGPTStep)
    prompts = ["photo", "", "ab", "information"]
    for options in OPTIONS:
        got, want = gpu.generate(prompts, options), cpu.generate(prompts, options)
        assert [r.token_ids for r in got] == [r.token_ids for r in want]


CUDA_TEXTS = ["abc", "j", "hgfedcba", "bad", "cafebabe", "ji", "abcdefghij", "aaaa"]


@pytest.mark.cuda
def test_cuda_one_graph_search_equals_cpu(search_bundle: Path) -> None:
    """On CUDA `auto` runs greedy and beam search in the one-graph variant at any batch size;
    its ids are the CPU loop's."""
    from edgeseq.runtime.generator import Generator

    gpu = _cuda_generator(search_bundle)
    cpu = Generator.load(search_bundle, providers="cpu", search="loop")
    for options in OPTIONS:
        big = GenerationOptions(beam_size=options.beam_size, batch_size=128)
        assert gpu.uses_graph(big)
        got, want = gpu.generate(CUDA_TEXTS, big), cpu.generate(CUDA_TEXTS, big)
        assert [r.token_ids for r in got] == [r.token_ids for r in want]


@pytest.mark.cuda
def test_cuda_step_batching_equals_cpu(steps_bundle: Path) -> None:
    """The server's live batch with its K/V on the GPU (DeviceTensors) answers greedy
    requests with the CPU's offline ids."""
    from edgeseq.runtime.generator import Generator
    from edgeseq.runtime.serve.batcher import BatchSettings
    from edgeseq.runtime.serve.continuous import StepBatcher, steps_decoder
    from edgeseq.runtime.serve.live_batch import DeviceTensors

    gpu = _cuda_generator(steps_bundle)
    steps = steps_decoder(gpu, "step")
    assert isinstance(steps.tensors(), DeviceTensors)
    cpu = Generator.load(steps_bundle, providers="cpu")
    batcher = StepBatcher(gpu, steps, BatchSettings(max_batch=8, max_wait_ms=2))
    batcher.start()
    try:
        futures = [batcher.submit([text], GenerationOptions(), 60) for text in CUDA_TEXTS]
        got = [future.result(60)[0] for future in futures]
    finally:
        batcher.close()
    want = cpu.generate(CUDA_TEXTS, GenerationOptions())
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
