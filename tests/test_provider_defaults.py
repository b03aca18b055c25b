"""Provider defaults: quiet auto without a GPU, $EDGESEQ_PROVIDER, explicit provider lists."""

from __future__ import annotations

import logging

import pytest

from edgeseq.cli.main import main
from edgeseq.runtime import providers
from edgeseq.runtime.errors import ProviderError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.providers import CPU_EP, CUDA_EP, open_sessions


class StandInSession:
    def __init__(self, active: list[str]) -> None:
        self.active = active

    def get_providers(self) -> list[str]:
        return self.active


@pytest.fixture
def requested(monkeypatch: pytest.MonkeyPatch) -> list:
    """onnxruntime offers CUDA and OpenVINO; sessions activate CPU only. Records requests."""
    seen: list = []

    def create_session(path, wanted, options):
        seen.append(wanted)
        return StandInSession([CPU_EP])

    monkeypatch.setattr(providers, "create_session", create_session)
    available = [CUDA_EP, "OpenVINOExecutionProvider", CPU_EP]
    monkeypatch.setattr(providers.ort, "get_available_providers", lambda: available)
    monkeypatch.setattr(providers, "cuda_library_error", lambda: None)
    return seen


def test_auto_without_any_gpu_is_quiet_and_never_tries_cuda(requested, monkeypatch, caplog) -> None:
    monkeypatch.setattr(providers, "gpu_present", lambda: False)
    with caplog.at_level(logging.DEBUG, logger="edgeseq"):
        assert open_sessions("e.onnx", "d.onnx", "auto")[2] == "cpu"
    assert requested == [[CPU_EP], [CPU_EP]]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_auto_with_a_gpu_whose_cuda_fails_warns(requested, monkeypatch, caplog) -> None:
    monkeypatch.setattr(providers, "gpu_present", lambda: True)
    with caplog.at_level(logging.WARNING, logger="edgeseq"):
        assert open_sessions("e.onnx", "d.onnx", "auto")[2] == "cpu"
    assert requested[0][0] == (CUDA_EP, {"device_id": 0})
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "CUDA is not available, running on CPU"
    ]


def test_gpu_present_reads_device_nodes_and_driver(monkeypatch) -> None:
    monkeypatch.setattr(providers.sys, "platform", "linux")
    monkeypatch.setattr(providers.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(providers.os.path, "exists", lambda path: False)
    assert providers.gpu_present() is False
    monkeypatch.setattr(providers.glob, "glob", lambda pattern: ["/dev/nvidia0"])
    assert providers.gpu_present() is True
    monkeypatch.setattr(providers.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(providers.os.path, "exists", lambda p: p == providers.NVIDIA_DRIVER_FILE)
    assert providers.gpu_present() is True


def test_environment_variable_sets_the_default(requested, monkeypatch) -> None:
    monkeypatch.setattr(providers, "gpu_present", lambda: True)
    monkeypatch.setenv("EDGESEQ_PROVIDER", " CPU ")
    assert providers.default_provider() == "cpu"
    assert open_sessions("e.onnx", "d.onnx")[2] == "cpu"
    assert requested == [[CPU_EP], [CPU_EP]]  # CUDA not tried although a GPU is "present"
    monkeypatch.setenv("EDGESEQ_PROVIDER", "cuda")
    with pytest.raises(ProviderError, match="provider 'cuda' was asked for"):
        open_sessions("e.onnx", "d.onnx")
    monkeypatch.setenv("EDGESEQ_PROVIDER", "gpu")
    with pytest.raises(ProviderError, match="EDGESEQ_PROVIDER='gpu' is not a provider choice"):
        providers.default_provider()
    monkeypatch.delenv("EDGESEQ_PROVIDER")
    assert providers.default_provider() == "auto"


def test_cli_provider_overrides_the_environment(runtime_case, monkeypatch, capsys) -> None:
    monkeypatch.setenv("EDGESEQ_PROVIDER", "gpu")
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", str(runtime_case.bundle), "abc"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: EDGESEQ_PROVIDER='gpu'") and err.count("\n") == 1
    main(["generate", str(runtime_case.bundle), "abc", "--provider", "cpu", "--threads", "1"])
    api = Generator.load(runtime_case.bundle, providers="cpu", threads=1).generate(["abc"])
    assert capsys.readouterr().out == api[0].text + "\n"


def test_provider_list_is_passed_on_and_read_back(requested) -> None:
    listed = ["OpenVINOExecutionProvider", CPU_EP]
    with pytest.raises(ProviderError, match="OpenVINOExecutionProvider was asked for but"):
        open_sessions("e.onnx", "d.onnx", listed)
    assert requested == [listed]
    assert open_sessions("e.onnx", "d.onnx", [CPU_EP])[2] == "cpu"


def test_provider_list_refuses_what_onnxruntime_does_not_offer(runtime_case) -> None:
    with pytest.raises(ProviderError, match="does not offer NoSuchExecutionProvider; it offers"):
        Generator.load(runtime_case.bundle, providers=["NoSuchExecutionProvider", CPU_EP])
    with pytest.raises(ProviderError, match="non-empty list of onnxruntime provider names"):
        Generator.load(runtime_case.bundle, providers=[])
    gen = Generator.load(runtime_case.bundle, providers=[CPU_EP], threads=1)
    assert gen.device == "cpu"
    assert gen.step_model.decoder.get_providers() == [CPU_EP]


def test_serve_takes_the_default_provider_as_generate_does(monkeypatch, capsys) -> None:
    """`edgeseq serve` without --provider leaves the choice to $EDGESEQ_PROVIDER (else auto),
    as `edgeseq generate` does; a bad value is one error line."""
    seen: list = []
    real = Generator.load

    def load(bundle, providers=None, **_):
        seen.append(providers)
        return real(bundle, providers=providers, threads=1)

    monkeypatch.setattr(Generator, "load", load)
    monkeypatch.setenv("EDGESEQ_PROVIDER", "bogus")
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "g2p-en", "--port", "0"])
    assert exit_info.value.code == 1 and seen == [None]
    assert capsys.readouterr().err.startswith("error: EDGESEQ_PROVIDER='bogus' is not a provider")
