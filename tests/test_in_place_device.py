"""The in-place cache decoder with its buffers on the session's device
(runtime/kinds/in_place_device.py), run here on the CPU provider with CPU OrtValues (the code
CUDA runs): the indirection-resolving row graph, ids equal to `InPlaceStep`'s and `OrtStep`'s
(greedy, beam, n-best, rows leaving, a forced prefix, buffers growing past 64 positions),
the state contract, that a step reads only the search's outputs to the host, and the
generator's choice of step model per device."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from host_transfers import count_transfers

from edgeseq.runtime import Generator
from edgeseq.runtime import constants as C
from edgeseq.runtime.device_rows import ELEMENT_TYPES, DeviceRows, resolve_model
from edgeseq.runtime.errors import CacheFullError
from edgeseq.runtime.kinds import in_place as in_place_module
from edgeseq.runtime.kinds import seq2seq as seq2seq_module
from edgeseq.runtime.kinds.bound_step import OrtBoundStep
from edgeseq.runtime.kinds.in_place import InPlaceStep
from edgeseq.runtime.kinds.in_place_device import InPlaceDeviceStep
from edgeseq.runtime.kinds.ort_step import OrtStep
from edgeseq.runtime.lazy import Lazy
from edgeseq.runtime.prefix import ForcedPrefix
from edgeseq.runtime.providers import CPU_EP
from edgeseq.runtime.search import GenerationOptions, search

CPU_ROWS = DeviceRows([CPU_EP], None, "cpu")
TEXTS = ["abc", "jihgfedcba", "a", "bbbbbbbbbb", "cafe", "decade", "hij", "ab", "gggg", "fab"]
OPTIONS = (
    GenerationOptions(),
    GenerationOptions(beam_size=4),
    GenerationOptions(beam_size=4, n_best=3),
)


def _resolved(array: np.ndarray, held: np.ndarray) -> np.ndarray:
    """numpy reference of DeviceRows.resolve: row r, column t < P from row held[r, t]."""
    out = np.zeros((len(held), *array.shape[1:]), array.dtype)
    for r, t in np.ndindex(*held.shape):
        out[r, :, t] = array[held[r, t], :, t]
    return out


def test_resolve_graph_is_valid_onnx_and_reads_rows_through_the_indirection() -> None:
    onnx = pytest.importorskip("onnx")
    signature = ((ELEMENT_TYPES["tensor(float)"], 4), (ELEMENT_TYPES["tensor(float16)"], 4))
    model = onnx.load_from_string(resolve_model(signature))
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(0)
    for batch, past, rows in ((5, 4, 7), (3, 1, 3), (1, 6, 4)):
        arrays = [
            rng.random((batch, 3, 9, 4), dtype=np.float32),
            rng.random((batch, 3, 9, 4)).astype(np.float16),
        ]
        held = rng.integers(0, batch, (rows, past))
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
        got = CPU_ROWS.resolve(values, held)
        for array, value in zip(arrays, got, strict=True):
            assert value.device_name().lower() == "cpu" and value.shape() == [rows, 3, 9, 4]
            np.testing.assert_array_equal(value.numpy(), _resolved(array, held))
    assert CPU_ROWS.resolve([], held) == ()


def _steps(bundle: Path, variant: str = "fp32") -> tuple[Generator, OrtStep, InPlaceStep, Any]:
    """The generator (CPU, loop), its OrtStep on decoder.onnx, its InPlaceStep and an
    InPlaceDeviceStep on "cpu" sharing the in-place decoder session."""
    gen = Generator.load(bundle, threads=1, variant=variant, search="loop")
    in_place = gen.in_place
    assert isinstance(gen.step_model, OrtStep) and isinstance(in_place, InPlaceStep)
    device = InPlaceDeviceStep(in_place.encoder, in_place.decoder, gen.config, "cpu")
    return gen, gen.step_model, in_place, device


def _tokens(hyps: list) -> list[list[tuple[int, ...]]]:
    return [[h.tokens for h in row] for row in hyps]


def _assert_same_hypotheses(got: list, want: list) -> None:
    assert _tokens(got) == _tokens(want)
    np.testing.assert_allclose(
        [h.score for row in got for h in row], [h.score for row in want for h in row], atol=1e-5
    )


@pytest.mark.parametrize("batch", [1, 4, 10])
def test_ids_equal_the_numpy_in_place_and_copying_step_models(in_place_bundle, batch) -> None:
    """Greedy, beam 4 and beam 4 with three hypotheses per input, inputs of different
    lengths finishing at different steps (rows and whole inputs leave the batch)."""
    gen, copying, in_place, device = _steps(in_place_bundle)
    lengths = []  # of the greedy outputs, per batch
    for start in range(0, len(TEXTS), batch):
        src = gen._padded([gen.encode(t) for t in TEXTS[start : start + batch]])
        for options in OPTIONS:
            got = search(device, src, options)
            _assert_same_hypotheses(got, search(in_place, src, options))
            _assert_same_hypotheses(got, search(copying, src, options))
        lengths.append({len(row[0].tokens) for row in search(device, src, OPTIONS[0])})
    assert batch == 1 or max(map(len, lengths)) > 1  # rows finished at different steps


def test_int8_in_place_decoder_on_device_buffers_equals_numpy_buffers(in_place_bundle) -> None:
    gen, _, in_place, device = _steps(in_place_bundle, "int8")
    src = gen._padded([gen.encode(t) for t in TEXTS])
    for options in OPTIONS:
        _assert_same_hypotheses(search(device, src, options), search(in_place, src, options))


def test_forced_prefix_on_device_buffers(in_place_bundle) -> None:
    """A forced target prefix (a multilingual model's language token and a target_prefix work
    this way, runtime/prefix.py), one per row, through the step models and the generator."""
    gen, copying, in_place, device = _steps(in_place_bundle)
    src = gen._padded([gen.encode(t) for t in TEXTS[:5]])
    target = gen.tokenizers.target
    prefixes = [target.encode(p) for p in ("J", "A", "C", "J", "E")]
    for options in OPTIONS:
        got = search(ForcedPrefix(device, prefixes), src, options)
        assert [row[0].tokens[:1] for row in got] == [tuple(p) for p in prefixes]
        _assert_same_hypotheses(got, search(ForcedPrefix(in_place, prefixes), src, options))
        _assert_same_hypotheses(got, search(ForcedPrefix(copying, prefixes), src, options))
    beam = GenerationOptions(beam_size=3, n_best=2, target_prefix="DC")
    want = gen.generate(TEXTS, beam)
    gen._in_place = Lazy(lambda: device)  # the generator's beam search on device buffers
    got = gen.generate(TEXTS, beam)
    assert [[c.token_ids for c in r.nbest] for r in got] == [
        [c.token_ids for c in r.nbest] for r in want
    ]
    assert all(r.text.startswith("DC") for r in got)


SELECTIONS = [
    [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3],  # first beam step: each input's row three times
    [2, 0, 0, 3, 5, 4, 8, 6, 7, 9, 9, 11],  # in-block reordering (indirection only)
    [1, 2, 0, 5, 4, 3, 11, 11, 9],  # input 2 leaves, the others reorder: blocks gathered
    [3, 4, 5, 6, 7, 8],  # input 0 leaves: whole blocks
    [5, 1, 1, 0],  # anything else: positions resolved through the indirection
    [3, 1],  # greedy-like: rows leave
]


@pytest.mark.parametrize("min_cache_len", [64, 2])
def test_every_select_path_matches_the_copying_step_model(
    in_place_bundle, monkeypatch, min_cache_len
) -> None:
    """Each kind of selection (reorder, whole blocks, resolve, rows leaving), with buffers
    that grow between them (min_cache_len 2), gives OrtStep's logits on the same rows; the
    state stays on the device (CPU OrtValues of the decoder's cache element type)."""
    monkeypatch.setattr(in_place_module, "MIN_CACHE_LEN", min_cache_len)
    gen, copying, _, device = _steps(in_place_bundle)
    src = gen._padded([gen.encode(t) for t in TEXTS[:4]])
    a, b = copying.start(src), device.start(src)
    assert b.cache_len == min(gen.config.max_len, max(min_cache_len, 2 * src.shape[1]))
    rng = np.random.default_rng(0)
    ids = np.full((4, 1), copying.bos_id, np.int64)
    cache_type = {arg.name: arg.type for arg in device.decoder.get_inputs()}[f"{C.PAST_K}.0"]
    for rows in [None, *SELECTIONS]:
        if rows is not None:
            rows = np.array(rows, np.int64)
            a, b = copying.select(a, rows), device.select(b, rows)
            ids = rng.integers(len(C.SPECIAL_TOKENS), copying.vocab_size, (len(rows), 1))
        want, a = copying.step(a, ids)
        got, b = device.step(b, ids)
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) < 1e-4
        assert b.past_len == a.past_len and b.batch == a.batch
        for value in (*b.cache_k, *b.cache_v, *b.cross_k, b.src_mask):
            assert value.device_name().lower() == "cpu"
        assert b.cache_k[0].data_type() == cache_type
    assert b.cache_len >= b.past_len


def test_states_are_used_once_and_the_cache_stops_at_max_len(in_place_bundle) -> None:
    gen, _, _, device = _steps(in_place_bundle)
    state = device.start(gen._padded([gen.encode("abc")]))
    ids = np.array([[device.bos_id]], np.int64)
    with pytest.raises(ValueError, match="one new token"):
        device.step(state, np.array([[1, 4]], np.int64))
    _, state = device.step(state, ids)  # the same state, one position further
    after = device.select(state, np.array([0, 0]))  # a new state: `state` is spent
    with pytest.raises(ValueError, match="used once"):
        device.step(state, ids)
    with pytest.raises(ValueError, match="used once"):
        device.select(state, np.array([0]))
    ids = np.repeat(ids, 2, axis=0)
    for _ in range(device.max_len - 1):
        _, after = device.step(after, ids)
    assert after.past_len == after.cache_len == device.max_len
    with pytest.raises(CacheFullError, match=f"max_len of {device.max_len} positions"):
        device.step(after, ids)
    with pytest.raises(ValueError, match="used once"):  # a failed step spends its state
        device.step(after, ids)


# -- a model with room for long outputs: buffers grow past their first 64 positions -----------
LONG_CONFIG = dict(
    d_model=64, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=64, max_len=160,
    dropout=0.0,
)  # fmt: skip  # heads of 32 values: the in-place kernel's sizes on CUDA too


@pytest.fixture(scope="module")
def long_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random model of LONG_CONFIG (char vocabularies) exported with fp32 and inplace
    (no parity; the tests compare engines); ~10 s."""
    import torch

    from edgeseq.build_model.model import Seq2SeqTransformer
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle
    from edgeseq.export.variants import VariantOptions
    from edgeseq.runtime.config import ModelConfig
    from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

    source = Tokenizer.train_char([string.ascii_lowercase[:12]])
    target = Tokenizer.train_char([string.ascii_uppercase[:20]])
    config = ModelConfig(
        src_vocab_size=source.vocab_size, tgt_vocab_size=target.vocab_size, **LONG_CONFIG
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = Seq2SeqTransformer(config).eval()
        bundle = tmp_path_factory.mktemp("inplace-long") / "long"
        export_bundle(
            model, TokenizerPair(source, target), bundle, verify=False,
            variants=VariantOptions(("fp32", "inplace")),
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return bundle


LONG_TEXTS = ["abcdefghijkl", "a", "lkjihg", "bbbbbbbbbbbbbbbbbbbb", "cafe"]


def test_buffers_grow_past_64_positions(long_bundle: Path) -> None:
    """100 new tokens from sources shorter than 32: buffers of 64 positions, doubled to 128;
    ids equal the numpy in-place and the copying step models', greedy, beam and n-best (the
    random model rarely ends a row; `min_new_tokens` makes sure of the length)."""
    gen, copying, in_place, device = _steps(long_bundle)
    src = gen._padded([gen.encode(t) for t in LONG_TEXTS])
    state = device.start(src)
    assert state.cache_len == 64
    ids = np.full((len(LONG_TEXTS), 1), device.bos_id, np.int64)
    for _ in range(65):
        _, state = device.step(state, ids)
    assert state.cache_len == 128 and state.past_len == 65
    for options in OPTIONS:
        longer = GenerationOptions(
            beam_size=options.beam_size, n_best=options.n_best, max_new_tokens=100,
            min_new_tokens=70,
        )  # fmt: skip
        got = search(device, src, longer)
        assert min(len(h.tokens) for row in got for h in row) >= 70
        _assert_same_hypotheses(got, search(in_place, src, longer))
        _assert_same_hypotheses(got, search(copying, src, longer))


def test_a_step_reads_only_the_search_outputs_to_the_host(in_place_bundle, monkeypatch) -> None:
    """Beam 4 over inputs that finish at different steps: every step copies only the
    search's outputs to the host, the source mask is the one array copied to the device as
    an OrtValue, and select moves no buffer through numpy."""
    gen, _, _, device = _steps(in_place_bundle)
    src = gen._padded([gen.encode(t) for t in TEXTS])
    calls = count_transfers(monkeypatch, device)
    hyps = search(device, src, GenerationOptions(beam_size=4))
    assert len({len(row[0].tokens) for row in hyps}) > 1  # inputs left at different steps
    assert calls["select"] >= calls["steps"] - 1 > 2  # a select after every step but the last
    assert calls["heads"] == len(C.TOP_OUTPUTS)  # the graph's top-k, not the logits
    assert calls["numpy"] == calls["steps"] * calls["heads"]  # only what the search reads
    assert calls["from_numpy"] == 1  # the source mask, once, at start


def _generator_on(bundle: Path, device: str, monkeypatch) -> Generator:
    """A loop Generator of `bundle` whose sessions are opened on the CPU but which takes the
    decoder state's device to be `device` (what open chooses; nothing runs)."""
    opened = seq2seq_module.open_sessions

    def sessions(*args: Any, **kwargs: Any) -> tuple:
        encoder, decoder, _ = opened(*args, **kwargs)
        return encoder, decoder, device

    monkeypatch.setattr(seq2seq_module, "open_sessions", sessions)
    return Generator.load(bundle, threads=1, search="loop")


def test_generator_opens_the_device_class_on_cuda_only(
    long_bundle, in_place_bundle, monkeypatch
) -> None:
    """On CUDA beam search on the loop takes the in-place decoder with device buffers (heads
    of 32 values here), and decoder.onnx where the CUDA kernel lacks the head size (8 in
    in_place_bundle's model); the CPU keeps the numpy buffers. Nothing opens before use."""
    beam = GenerationOptions(beam_size=4)
    cuda = _generator_on(long_bundle, "cuda", monkeypatch)
    assert cuda._in_place is not None and not cuda._in_place.opened
    model = cuda.loop_model(beam)
    assert isinstance(model, InPlaceDeviceStep) and model.device_type == "cuda"
    assert isinstance(cuda.loop_model(GenerationOptions()), OrtBoundStep)
    assert not isinstance(cuda.loop_model(GenerationOptions()), InPlaceDeviceStep)
    small_heads = _generator_on(in_place_bundle, "cuda", monkeypatch)
    assert small_heads.in_place is None
    assert not isinstance(small_heads.loop_model(beam), InPlaceDeviceStep)
    cpu = _generator_on(long_bundle, "cpu", monkeypatch)
    assert isinstance(cpu.loop_model(beam), InPlaceStep)


# -- on a GPU (`pytest -m cuda`) ----------------------------------------------------------------
@pytest.mark.cuda
def test_cuda_in_place_decoder_equals_cpu(long_bundle: Path) -> None:
    """Beam search on the CUDA loop runs the in-place decoder with its buffers on the GPU;
    its ids (greedy, beam 4, n-best, buffers grown past 64 positions) are the CPU's."""
    from edgeseq.runtime.errors import ProviderError

    try:
        gpu = Generator.load(long_bundle, providers="cuda", search="loop")
    except ProviderError as exc:
        pytest.skip(f"no usable CUDA GPU on this machine: {exc}")
    cpu = Generator.load(long_bundle, providers="cpu", search="loop")
    model = gpu.in_place
    assert isinstance(model, InPlaceDeviceStep) and model.device_type == "cuda"
    src = gpu._padded([gpu.encode(t) for t in LONG_TEXTS])
    for options in OPTIONS:
        longer = GenerationOptions(
            beam_size=options.beam_size, n_best=options.n_best, max_new_tokens=100
        )
        want = search(cpu.in_place, src, longer)
        assert _tokens(search(model, src, longer)) == _tokens(want)
    state = model.select(model.step(model.start(src), np.ones((5, 1), np.int64))[1], [4, 4, 0])
    values = [*state.cache_k, *state.cache_v, *state.cross_k, *state.cross_v, state.src_mask]
    assert all(v.device_name().lower() == "cuda" for v in values)
