"""Execution providers and session options: CUDA when it really loads, else CPU.

    encoder, decoder, device = open_sessions("b/encoder.onnx", "b/decoder.onnx", "auto")
    device  # "cuda" or "cpu": what the sessions actually run on

Choices (`PROVIDER_CHOICES`):

- ``"auto"``: try CUDA; if onnxruntime has no CUDA provider, or the provider does not
  become active (missing CUDA/cuDNN libraries, no GPU), use CPU and log one warning saying why;
- ``"cuda"``: strict; raise `ProviderError` when CUDA is not active after session creation;
- ``"cpu"``: CPU only.

onnxruntime silently falls back to CPU when a requested provider fails to load, so the
active providers are always read back with ``session.get_providers()`` after creation.
When the CUDA provider's shared library cannot even be loaded (onnxruntime-gpu without the
CUDA libraries), no CUDA session is attempted, which spares onnxruntime's error log.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import onnxruntime as ort

from .errors import BundleError, ProviderError

logger = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
PROVIDER_CHOICES = ("auto", "cuda", "cpu")
OPTIMIZATION_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def check_provider(name: str) -> str:
    """Normalise a provider choice ("auto", "cuda", "cpu"; any case) or raise ProviderError."""
    choice = name.strip().lower() if isinstance(name, str) else name
    if choice not in PROVIDER_CHOICES:
        raise ProviderError(
            f"unknown execution provider {name!r}; choose one of {', '.join(PROVIDER_CHOICES)}"
        )
    return choice


def default_threads() -> int:
    """CPU cores this process may run on (the default intra-op thread count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


SPINNING_KEY = "session.intra_op.allow_spinning"


def session_options(threads: int | None = None, optimization: str = "all") -> ort.SessionOptions:
    """Session options: `threads` intra-op threads (default: every core) and a graph
    optimization level ("disabled", "basic", "extended" or "all").

    The intra-op pool threads do not spin while waiting for work: a decoder step is a few
    small kernels, and spinning threads take the cores from the thread that has work
    (`benchmarks/session_spinning.py` measures both; docs/bench.md has the numbers)."""
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ProviderError(f"threads must be a positive integer, got {threads!r}")
    if optimization not in OPTIMIZATION_LEVELS:
        raise ProviderError(
            f"unknown graph optimization level {optimization!r}; "
            f"choose one of {', '.join(OPTIMIZATION_LEVELS)}"
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.inter_op_num_threads = 1  # the graphs are sequential; one op at a time
    options.add_session_config_entry(SPINNING_KEY, "0")
    options.graph_optimization_level = OPTIMIZATION_LEVELS[optimization]
    return options


def cuda_library_error() -> str | None:
    """Why onnxruntime's CUDA provider library cannot be loaded, or None when it loads (or
    there is no such file to check). onnxruntime dlopens the same file the same way, so a
    failure here means creating a CUDA session would fail too, after printing errors."""
    library = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if not library.is_file():
        return None
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:  # e.g. "libcublasLt.so.13: cannot open shared object file"
        return f"the CUDA provider library cannot be loaded: {exc}"
    return None


def cuda_unavailable_reason() -> str:
    """Why the CUDA provider is not active, as precisely as can be found out."""
    if CUDA_EP not in ort.get_available_providers():
        return (
            f"this onnxruntime {ort.__version__} has no CUDA provider "
            "(install onnxruntime-gpu for CUDA)"
        )
    return cuda_library_error() or (
        "the CUDA provider did not start (no usable GPU or driver; see onnxruntime's log)"
    )


def create_session(
    path: str | Path, providers: list, options: ort.SessionOptions
) -> ort.InferenceSession:
    """An InferenceSession for the graph at `path`; load failures become BundleError."""
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types
        raise BundleError(f"onnxruntime cannot load {path}: {exc}") from None


def open_sessions(
    encoder_path: str | Path,
    decoder_path: str | Path,
    providers: str = "auto",
    threads: int | None = None,
    optimization: str = "all",
    device_id: int = 0,
) -> tuple[ort.InferenceSession, ort.InferenceSession, str]:
    """Open the encoder and decoder graphs; return both sessions and the active device
    ("cuda" or "cpu"). See the module docstring for what each provider choice does."""
    choice = check_provider(providers)
    options = session_options(threads, optimization)
    cpu = [CPU_EP]
    if choice == "cpu":
        return (
            create_session(encoder_path, cpu, options),
            create_session(decoder_path, cpu, options),
            "cpu",
        )
    cuda = [(CUDA_EP, {"device_id": device_id}), CPU_EP]
    if CUDA_EP in ort.get_available_providers() and cuda_library_error() is None:
        encoder = create_session(encoder_path, cuda, options)
        if CUDA_EP in encoder.get_providers():
            decoder = create_session(decoder_path, cuda, options)
            if CUDA_EP in decoder.get_providers():
                return encoder, decoder, "cuda"
    reason = cuda_unavailable_reason()
    if choice == "cuda":
        raise ProviderError(
            f"provider 'cuda' was asked for but CUDA is not active: {reason}. "
            "Use provider 'cpu' (or 'auto' to fall back with a warning)."
        )
    logger.warning("CUDA is not available, running on CPU: %s", reason)
    return (
        create_session(encoder_path, cpu, options),
        create_session(decoder_path, cpu, options),
        "cpu",
    )
