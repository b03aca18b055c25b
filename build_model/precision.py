"""Is bf16 autocast worth it on this CPU? A recipe's `precision: bf16` doubles training speed
on CPUs with native bfloat16 instructions (AVX-512 BF16, AMX) and slows it down several times
on CPUs without them (AVX2 only), where PyTorch emulates bfloat16 matmuls.

    ratio = bf16_slowdown()     # seconds bf16 / seconds fp32 of one linear layer, fwd + bwd
    warn_if_bf16_slow(recipe)   # logs a warning when bf16 is slower; returns the ratio
"""

from __future__ import annotations

import logging
import time

import torch

from .recipe import Recipe

logger = logging.getLogger(__name__)

SLOW_BF16 = 1.5  # warn when a bf16 step takes this many times a fp32 one


def _seconds(bf16: bool, repeats: int) -> float:
    """Fastest of `repeats` forward + backward passes of a 256 -> 1024 linear layer on
    (512, 256). Its tensors come from a private generator: the global RNG, which a resumed
    run has just restored for dropout, is left untouched."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1024, 256, generator=generator).mul_(0.05).requires_grad_()
    bias = torch.zeros(1024, requires_grad=True)
    x = torch.randn(512, 256, generator=generator)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = torch.nn.functional.linear(x, weight, bias)
        y.float().sum().backward()
        times.append(time.perf_counter() - start)
    return min(times[1:])  # the first pass warms up


def bf16_slowdown(repeats: int = 3) -> float:
    """How many times longer a bf16-autocast linear layer (forward + backward) takes than the
    same layer in fp32 on this CPU, with torch's current thread count: below 1 where bf16 is
    native, several times 1 where it is emulated. Takes tens of milliseconds."""
    return _seconds(True, repeats) / max(_seconds(False, repeats), 1e-9)


def warn_if_bf16_slow(recipe: Recipe) -> float | None:
    """For a recipe with `precision: bf16`, measure `bf16_slowdown` and log a warning saying
    what to do when bf16 is slower than fp32 here; return the ratio (None for fp32 recipes)."""
    if recipe.precision != "bf16":
        return None
    ratio = bf16_slowdown()
    if ratio > SLOW_BF16:
        logger.warning(
            "bf16 autocast is %.1fx slower than fp32 on this CPU (no native bfloat16 "
            'instructions); set "precision": "fp32" in the recipe (--resume --recipe can '
            "change it) unless the run will move to a CPU with AVX-512 BF16 or AMX",
            ratio,
        )
    return ratio
