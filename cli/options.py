"""Options that several commands take, declared once: the same name, type, default and help
wherever they appear.

    @click.command()
    @provider_option()
    @threads_option()
    @variant_option()
    def generate(..., provider, threads, variant): ...

Each function returns a click decorator; where a command's default differs (`edgeseq bench`
times one thread on the CPU by default), it is an argument, and the help says so.
Torch-free: these import only the runtime and the torch-free export limits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from edgeseq.runtime.providers import OPTIMIZATION_LEVELS, PROVIDER_CHOICES

F = TypeVar("F", bound=Callable[..., Any])

PROVIDER_HELP = (
    "auto: CUDA if a GPU is usable, else CPU (a warning only when a GPU is present but "
    "CUDA fails); cuda: strict; cpu."
)
THREADS_HELP = "Intra-op threads (default: all cores)."
VARIANT_HELP = (
    "Graph variant of the bundle: fp32, int8, fp16 or ort (edgeseq inspect lists them; "
    "default: fp32, or the only variant of a built-in bundle)."
)


def provider_option(default: str | None = None) -> Callable[[F], F]:
    """--provider: auto, cuda or cpu; unset (None): $EDGESEQ_PROVIDER, else auto."""
    if default is None:
        return click.option(
            "--provider",
            type=click.Choice(PROVIDER_CHOICES, case_sensitive=False),
            default=None,
            help=f"{PROVIDER_HELP} Default: $EDGESEQ_PROVIDER, else auto.",
        )
    return click.option(
        "--provider",
        type=click.Choice(PROVIDER_CHOICES, case_sensitive=False),
        default=default,
        show_default=True,
        help=PROVIDER_HELP,
    )


def threads_option(default: int | None = None, help: str = THREADS_HELP) -> Callable[[F], F]:
    """--threads N (N >= 1); unset (None): the engine's choice, as `help` says."""
    return click.option(
        "--threads",
        type=click.IntRange(1),
        default=default,
        show_default=default is not None,
        help=help,
    )


def variant_option(multiple: bool = False) -> Callable[[F], F]:
    """--variant NAME: the bundle's graph variant; `multiple`: repeatable, into `variants`."""
    if multiple:
        return click.option(
            "--variant", "variants", multiple=True, help="Only these variants (repeatable)."
        )
    return click.option("--variant", default=None, help=VARIANT_HELP)


def optimization_option() -> Callable[[F], F]:
    """--optimization LEVEL: onnxruntime's graph optimization level."""
    return click.option(
        "--optimization",
        type=click.Choice(list(OPTIMIZATION_LEVELS)),
        default="all",
        show_default=True,
        help="onnxruntime graph optimization level.",
    )


def data_option() -> Callable[[F], F]:
    """--data FILE: held-out inputs of `edgeseq export` and `verify`, instead of the task's."""
    return click.option(
        "--data",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="Held-out inputs for parity level 3 and the gates: one input per line, optionally "
        "TAB reference (default: the checkpoint task's dev split, else random ids).",
    )


def inputs_option(help: str) -> Callable[[F], F]:
    """--inputs N: how many held-out inputs `edgeseq export` and `verify` check."""
    from edgeseq.export.limits import LEVEL3_MIN_INPUTS  # torch-free; not for the runtime's

    return click.option(
        "--inputs", type=click.IntRange(1), default=LEVEL3_MIN_INPUTS, show_default=True, help=help
    )
