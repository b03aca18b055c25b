"""Execution providers: strict CUDA, auto fallback with one warning, CPU (issue 4).

The machines running CI have no GPU: the CUDA decision logic is tested with stand-in
sessions, and the tests that need a real GPU carry the `cuda` marker and skip here.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from edgeseq.runtime import providers
from edgeseq.runtime.errors import ProviderError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.kinds.seq2seq import OrtBoundStep, OrtStep
from edgeseq.runtime.providers import (
    CPU_EP,
    CUDA_EP,
    default_threads,
    open_sessions,
    session_options,
)
from edgeseq.runtime.search import GenerationOptions

TEXTS = ["abc", "hgfedcba", "j"]


@pytest.fixture(scope="module")
def cuda_active(runtime_case) -> bool:
    """Whether a strict CUDA Generator loads here (tried once per module)."""
    try:
        return Generator.load(runtime_case.bundle, providers="cuda").device == "cuda"
    except ProviderError:
        return False


# -- choices and options ----------------------------------------------------------------------
def test_unknown_provider_lists_the_choices(runtime_case) -> None:
    with pytest.raises(ProviderError, match="unknown execution provider 'tpu'; choose one of "):
        providers.check_provider("tpu")
    with pytest.raises(ProviderError, match="choose one of auto, cuda, cpu"):
        Generator.load(runtime_case.bundle, providers="tpu")
    assert providers.check_provider(" CPU ") == "cpu"


def test_session_options() -> None:
    options = session_options()
    assert options.intra_op_num_threads == default_threads() >= 1
    assert session_options(threads=1, optimization="basic").intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    with pytest.raises(ProviderError, match="threads must be a positive integer, got 0"):
        session_options(threads=0)
    with pytest.raises(ProviderError, match="unknown graph optimization level 'max'; choose"):
        session_options(optimization="max")


def test_cpu_provider(runtime_case) -> None:
    gen = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
    assert gen.device == "cpu" and isinstance(gen.step_model, OrtStep)
    assert gen.step_model.encoder.get_providers() == [CPU_EP]


# -- on this machine --------------------------------------------------------------------------
def test_strict_cuda_raises_when_cuda_is_not_active(runtime_case, cuda_active: bool) -> None:
    if cuda_active:
        pytest.skip("CUDA works on this machine")
    with pytest.raises(ProviderError, match="provider 'cuda' was asked for but CUDA is not active"):
        Generator.load(runtime_case.bundle, providers="cuda", threads=1)


def test_auto_falls_back_to_cpu_warning_only_when_a_gpu_is_present(
    runtime_case, cuda_active: bool, caplog: pytest.LogCaptureFixture
) -> None:
    if cuda_active:
        pytest.skip("CUDA works on this machine")
    with caplog.at_level(logging.WARNING, logger="edgeseq"):
        gen = Generator.load(runtime_case.bundle, providers="auto", threads=1)
    assert gen.device == "cpu"
    warnings = [r.getMessage() for r in caplog.records if r.name == "edgeseq.runtime.providers"]
    assert len(warnings) == (1 if providers.gpu_present() else 0)
    assert all(w.startswith("CUDA is not available, running on CPU: ") for w in warnings)


# -- the decision logic, with stand-in sessions -----------------------------------------------
class StandInSession:
    def __init__(self, path: str, active: list[str]) -> None:
        self.path, self.active = path, active

    def get_providers(self) -> list[str]:
        return self.active


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch):
    """Make onnxruntime list CUDA and let the test say whether sessions activate it."""
    state = {"cuda_loads": True, "requested": []}

    def create_session(path, requested, options):
        state["requested"].append(requested)
        wants_cuda = any(p == CUDA_EP or p[0] == CUDA_EP for p in requested)
        cuda = wants_cuda and state["cuda_loads"]
        return StandInSession(str(path), [CUDA_EP, CPU_EP] if cuda else [CPU_EP])

    monkeypatch.setattr(providers, "create_session", create_session)
    monkeypatch.setattr(providers.ort, "get_available_providers", lambda: [CUDA_EP, CPU_EP])
    monkeypatch.setattr(providers, "cuda_unavailable_reason", lambda: "no GPU (stand-in)")
    monkeypatch.setattr(providers, "cuda_library_error", lambda: None)
    monkeypatch.setattr(providers, "gpu_present", lambda: True)
    return state


@pytest.mark.parametrize("choice", ["auto", "cuda"])
def test_cuda_is_used_when_it_becomes_active(stand_in, choice: str) -> None:
    _encoder, decoder, device = open_sessions("e.onnx", "d.onnx", choice)
    assert device == "cuda"
    assert stand_in["requested"][0][0] == (CUDA_EP, {"device_id": 0})
    assert decoder.get_providers()[0] == CUDA_EP


def test_inactive_cuda_strict_raises_auto_warns_once(stand_in, caplog) -> None:
    stand_in["cuda_loads"] = False
    with pytest.raises(ProviderError, match=r"CUDA is not active: no GPU \(stand-in\)"):
        open_sessions("e.onnx", "d.onnx", "cuda")
    with caplog.at_level(logging.WARNING, logger="edgeseq"):
        _encoder, _decoder, device = open_sessions("e.onnx", "d.onnx", "auto")
    assert device == "cpu" and stand_in["requested"][-1] == [CPU_EP]
    assert [r.getMessage() for r in caplog.records] == [
        "CUDA is not available, running on CPU: no GPU (stand-in)"
    ]


def test_a_build_without_cuda_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers.ort, "get_available_providers", lambda: [CPU_EP])
    assert "has no CUDA provider (install onnxruntime-gpu" in providers.cuda_unavailable_reason()


def test_an_unloadable_cuda_library_skips_the_cuda_session(stand_in, monkeypatch) -> None:
    error = "the CUDA provider library cannot be loaded: libcublasLt.so.13: cannot open"
    monkeypatch.setattr(providers, "cuda_library_error", lambda: error)
    monkeypatch.setattr(providers, "cuda_unavailable_reason", lambda: error)
    with pytest.raises(ProviderError, match=r"libcublasLt\.so\.13"):
        open_sessions("e.onnx", "d.onnx", "cuda")
    assert stand_in["requested"] == []  # onnxruntime never tried (and never logged) CUDA
    assert open_sessions("e.onnx", "d.onnx", "auto")[2] == "cpu"
    assert stand_in["requested"] == [[CPU_EP], [CPU_EP]]


# -- on a GPU ---------------------------------------------------------------------------------
@pytest.mark.cuda
def test_cuda_generation_matches_cpu(runtime_case, cuda_active: bool) -> None:
    if not cuda_active:
        pytest.skip("no usable CUDA GPU on this machine")
    gpu = Generator.load(runtime_case.bundle, providers="cuda")
    cpu = Generator.load(runtime_case.bundle, providers="cpu")
    assert gpu.device == "cuda" and isinstance(gpu.step_model, OrtBoundStep)
    assert CUDA_EP in gpu.step_model.decoder.get_providers()
    for options in (GenerationOptions(), GenerationOptions(beam_size=4, n_best=2)):
        got, want = gpu.generate(TEXTS, options), cpu.generate(TEXTS, options)
        assert [r.token_ids for r in got] == [r.token_ids for r in want]
        np.testing.assert_allclose([r.score for r in got], [r.score for r in want], atol=1e-3)


@pytest.mark.cuda
def test_cuda_cache_stays_on_the_device(runtime_case, cuda_active: bool) -> None:
    if not cuda_active:
        pytest.skip("no usable CUDA GPU on this machine")
    step = Generator.load(runtime_case.bundle, providers="cuda").step_model
    state = step.start(np.array([[4, 5, 6, 2]], dtype=np.int64))
    logits, state = step.step(state, np.array([[1]], dtype=np.int64))
    assert isinstance(logits, np.ndarray)
    assert all(v.device_name().lower() == "cuda" for v in state.past_k + state.past_v)
    assert all(v.device_name().lower() == "cuda" for v in state.cross_k + state.cross_v)
