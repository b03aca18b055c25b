"""Execution providers and session options: CUDA when it really loads, else CPU.

    encoder, decoder, device = open_sessions("b/encoder.onnx", "b/decoder.onnx", "auto")
    device  # "cuda" or "cpu": what the sessions actually run on

Choices (`PROVIDER_CHOICES`; the default is the environment variable ``EDGESEQ_PROVIDER``,
else ``"auto"``; an explicit argument or ``--provider`` overrides it):

- ``"auto"``: CUDA when a usable GPU is there, else CPU. On a machine with no NVIDIA GPU at
  all (`gpu_present`: no NVIDIA device node or driver) CUDA is not tried and nothing is
  logged; when a GPU is present but CUDA does not become active (onnxruntime without CUDA,
  missing CUDA/cuDNN libraries), CPU is used and one warning says why;
- ``"cuda"``: strict; raise `ProviderError` when CUDA is not active after session creation;
- ``"cpu"``: CPU only;
- a list of onnxruntime provider names (optionally ``(name, options)`` pairs), tried in order,
  e.g. ``["OpenVINOExecutionProvider", "CPUExecutionProvider"]``: each must be offered by the
  installed onnxruntime, and the first must be active after session creation (else
  `ProviderError`), the same read-back check as strict ``"cuda"``.

onnxruntime silently falls back to CPU when a requested provider fails to load, so the
active providers are always read back with ``session.get_providers()`` after creation.
When the CUDA provider's shared library cannot even be loaded (onnxruntime-gpu without the
CUDA libraries), no CUDA session is attempted, which spares onnxruntime's error log.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from .errors import BundleError, ProviderError

logger = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
PROVIDER_CHOICES = ("auto", "cuda", "cpu")
PROVIDER_ENV = "EDGESEQ_PROVIDER"
NVIDIA_DEVICE_GLOB = "/dev/nvidia[0-9]*"  # one node per GPU, created by the NVIDIA driver
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"  # present while the driver is loaded
Providers = str | Sequence[str | tuple[str, dict[str, Any]]] | None
# onnxruntime graph optimizations every edgeseq session leaves out because they made the
# bundles' graphs slower: SkipLayerNormFusion (residual Add + LayerNormalization into one
# node) cost 10-30% of tokens/s on the fused g2p-en graphs, fp32 and int8 (docs/bench.md).
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)
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


def default_provider() -> str:
    """The provider choice when none is given: $EDGESEQ_PROVIDER, else "auto"."""
    value = os.environ.get(PROVIDER_ENV, "").strip()
    if not value:
        return "auto"
    try:
        return check_provider(value)
    except ProviderError:
        raise ProviderError(
            f"{PROVIDER_ENV}={value!r} is not a provider choice; set it to one of "
            f"{', '.join(PROVIDER_CHOICES)} or unset it"
        ) from None


def check_providers(providers: Providers) -> str | list[str | tuple[str, dict[str, Any]]]:
    """A choice ("auto", "cuda", "cpu"; None: `default_provider()`) normalised, or a list of
    onnxruntime provider names checked against those the installed onnxruntime offers."""
    if providers is None:
        return default_provider()
    if isinstance(providers, str):
        return check_provider(providers)
    listed = list(providers)
    names = [p[0] if isinstance(p, tuple) else p for p in listed]
    if not names or not all(isinstance(n, str) for n in names):
        raise ProviderError(
            f"providers must be a choice ({', '.join(PROVIDER_CHOICES)}) or a non-empty list "
            f"of onnxruntime provider names, got {providers!r}"
        )
    available = ort.get_available_providers()
    missing = [n for n in names if n not in available]
    if missing:
        raise ProviderError(
            f"this onnxruntime {ort.__version__} does not offer {', '.join(missing)}; it offers "
            f"{', '.join(available)} (install the onnxruntime build that has it, e.g. "
            "onnxruntime-openvino)"
        )
    return listed


def gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible at all: on Linux a device node /dev/nvidiaN or the
    loaded driver (/proc/driver/nvidia/version); elsewhere the CUDA driver library (nvcuda
    on Windows, libcuda). Cheap: no CUDA context is created."""
    if sys.platform.startswith("linux"):
        return bool(glob.glob(NVIDIA_DEVICE_GLOB)) or os.path.exists(NVIDIA_DRIVER_FILE)
    return ctypes.util.find_library("nvcuda" if sys.platform == "win32" else "cuda") is not None


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
    (docs/experiments.md has the measurement).

    The CPU memory arena is off: it keeps the largest blocks a batch ever asked for (the
    cache of beam 4 x batch 32 on an opus-mt-sized decoder: 100-200 MB above what is live),
    while the step's tensors are few and large, so allocating them from the system is not
    slower (benchmarks/marian_rss.py measures both)."""
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
    options.enable_cpu_mem_arena = False
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
        return ort.InferenceSession(
            str(path), options, providers=providers, disabled_optimizers=DISABLED_OPTIMIZERS
        )
    except Exception as exc:  # onnxruntime raises its own exception types
        raise BundleError(f"onnxruntime cannot load {path}: {exc}") from None


def open_listed(
    paths: Sequence[str | Path],
    providers: list[str | tuple[str, dict[str, Any]]],
    options: ort.SessionOptions,
) -> tuple[list[ort.InferenceSession], str]:
    """Sessions on an explicit provider list; ProviderError unless the first is active.
    The device is "cuda", "cpu" or the active provider's name."""
    first = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
    sessions = []
    for path in paths:
        session = create_session(path, list(providers), options)
        active = session.get_providers()
        if first not in active:
            raise ProviderError(
                f"{first} was asked for but onnxruntime runs {Path(path).name} on "
                f"{', '.join(active)}: check that provider's installation (onnxruntime's log "
                "says why it did not start), or list another provider first"
            )
        sessions.append(session)
    return sessions, {CUDA_EP: "cuda", CPU_EP: "cpu"}.get(first, first)


def open_graphs(
    paths: Sequence[str | Path],
    providers: Providers = None,
    threads: int | None = None,
    optimization: str = "all",
    device_id: int = 0,
) -> tuple[list[ort.InferenceSession], str]:
    """Open the graphs at `paths` on one device; return their sessions and the active device
    ("cuda", "cpu", or the first listed provider's name). `providers` is a choice, a list of
    onnxruntime providers, or None ($EDGESEQ_PROVIDER, else "auto"): see the module
    docstring. With "auto" or "cuda", every graph must run on CUDA, else all run on the CPU
    ("auto", with a warning) or ProviderError ("cuda")."""
    choice = check_providers(providers)
    options = session_options(threads, optimization)
    if not isinstance(choice, str):
        return open_listed(paths, choice, options)
    cpu = [CPU_EP]
    if choice == "cpu" or (choice == "auto" and not gpu_present()):
        return [create_session(path, cpu, options) for path in paths], "cpu"
    cuda = [(CUDA_EP, {"device_id": device_id}), CPU_EP]
    if CUDA_EP in ort.get_available_providers() and cuda_library_error() is None:
        sessions = []
        for path in paths:
            session = create_session(path, cuda, options)
            if CUDA_EP not in session.get_providers():
                break
            sessions.append(session)
        else:
            return sessions, "cuda"
    reason = cuda_unavailable_reason()
    if choice == "cuda":
        raise ProviderError(
            f"provider 'cuda' was asked for but CUDA is not active: {reason}. "
            "Use provider 'cpu' (or 'auto' to fall back with a warning)."
        )
    logger.warning("CUDA is not available, running on CPU: %s", reason)
    return [create_session(path, cpu, options) for path in paths], "cpu"


def open_sessions(
    encoder_path: str | Path,
    decoder_path: str | Path,
    providers: Providers = None,
    threads: int | None = None,
    optimization: str = "all",
    device_id: int = 0,
) -> tuple[ort.InferenceSession, ort.InferenceSession, str]:
    """Open the encoder and decoder graphs (`open_graphs`); return both sessions and the
    active device."""
    (encoder, decoder), device = open_graphs(
        (encoder_path, decoder_path), providers, threads, optimization, device_id
    )
    return encoder, decoder, device


def open_session(
    path: str | Path,
    providers: Providers = None,
    threads: int | None = None,
    optimization: str = "all",
    device_id: int = 0,
) -> tuple[ort.InferenceSession, str]:
    """Open one graph (a GPT or BERT bundle's model.onnx, `open_graphs`); return its session
    and the active device."""
    (session,), device = open_graphs((path,), providers, threads, optimization, device_id)
    return session, device
