"""What this machine's CPU does to a bundle's int8 variant: its feature flags, and the
warning for int8 weights of 8 bits on an x86 CPU without VNNI (`edgeseq export
--int8-weight-bits 8`, docs/export.md), whose uint8 x int8 instruction adds pairs of
products into int16 and saturates.

    warning = saturation_warning(bundle.manifest, "int8")   # None where nothing drifts
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})  # x86 flags of u8 x s8 dot products
X86_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux), or None where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), None)
    return None if line is None else frozenset(line.partition(":")[2].split())


def saturation_warning(
    manifest: dict[str, Any],
    variant: str,
    machine: str | None = None,
    flags: frozenset[str] | None = None,
) -> str | None:
    """A warning for running variant `variant` of a bundle here when its int8 weights have 8
    bits (`edgeseq export --int8-weight-bits 8`) and this is an x86 CPU without VNNI, whose
    u8 x s8 instruction adds pairs of products into int16 and saturates with 8-bit weights;
    None otherwise (7-bit weights, another architecture, VNNI, or flags not readable).
    `machine` and `flags` default to this machine's."""
    entry = (manifest.get("variants") or {}).get(variant)
    quantization = entry.get("quantization") if isinstance(entry, dict) else None
    if not isinstance(quantization, dict) or quantization.get("reduce_range", True):
        return None
    machine = (machine or platform.machine()).lower()
    flags = cpu_flags() if flags is None and machine in X86_MACHINES else flags
    if machine not in X86_MACHINES or flags is None or VNNI_FLAGS & flags:
        return None
    return (
        f"variant {variant!r} has 8-bit int8 weights (exported with --int8-weight-bits 8), "
        "which saturate on this x86 CPU without VNNI: its outputs drift from fp32's. Export "
        "the bundle with 7-bit weights (the default) for this machine, or use fp32"
    )
