"""The accuracy gate every variant of every kind passes: its outputs on the held-out inputs
against fp32's, by the task metric, at most `max_drop` points worse.

    numbers = gate_numbers("wer", 0.120, 0.123, agreement=0.97, max_drop=0.5, inputs=200,
                           source="dev split")
    numbers["passed"]                          # False: the drop is 0.3 points... or not
    raise_if_missed("int8", numbers)           # GateError carrying the one-row table

The metric is WER (lower is better: g2p and `--data` references), exact match, or, with no
references, agreement with fp32 itself. Drops are in points (100 x the rate difference).
The encoder–decoder's int8 searches for layer groups to keep in fp32 until it passes
(export/kinds/seq2seq/precisions.py); the one-graph kinds gate without a search
(export/kinds/one_graph.py). Both report with these numbers and raise `GateError`.
"""

from __future__ import annotations

from typing import Any

from edgeseq.runtime.errors import EdgeseqError

LOWER_IS_BETTER = {"wer": True, "exact_match": False, "agreement": False}
ROW_KEYS = ("metric", "fp32", "variant", "drop_points", "agreement", "passed")


class GateError(EdgeseqError):
    """A variant misses its accuracy gate; `attempts` is the table of what was tried."""

    def __init__(self, message: str, variant: str, attempts: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.variant, self.attempts = variant, attempts


def within_limit(drop_points: float, max_drop_points: float) -> bool:
    """Whether a drop passes the gate. Both are rates of counts (errors per reference
    token, say) in points, so a drop of exactly the limit computed in floating point
    (0.5000000000000004 for 0.5) must pass: compare with a tolerance far below one count."""
    return drop_points <= max_drop_points + 1e-9


def gate_numbers(
    metric: str,
    fp32: float,
    variant: float,
    *,
    agreement: float,
    max_drop: float,
    inputs: int,
    source: str,
    **extra: Any,
) -> dict[str, Any]:
    """The gate entry of a variant scoring `variant` where fp32 scores `fp32` on `metric`:
    the drop in points, whether it passes, and `extra` fields (provider, all scores)."""
    drop = 100 * ((variant - fp32) if LOWER_IS_BETTER[metric] else (fp32 - variant))
    return {
        "inputs": inputs,
        "source": source,
        **extra,
        "metric": metric,
        "fp32": round(fp32, 6),
        "variant": round(variant, 6),
        "drop_points": round(drop, 4),
        "max_drop_points": max_drop,
        "agreement": round(agreement, 6),
        "passed": within_limit(drop, max_drop),
    }


def gate_row(numbers: dict[str, Any]) -> dict[str, Any]:
    """The fields of a gate entry that a row of the attempts table shows."""
    return {k: numbers[k] for k in ROW_KEYS}


def gate_summary(numbers: dict[str, Any]) -> str:
    """One line of a missed gate's numbers, for error messages."""
    return (
        f"{numbers['metric']} {numbers['fp32']:.2%} -> {numbers['variant']:.2%}, drop "
        f"{numbers['drop_points']:.2f} points > {numbers['max_drop_points']}, agreement "
        f"{numbers['agreement']:.1%}"
    )


def raise_if_missed(variant: str, numbers: dict[str, Any], hint: str = "") -> dict[str, Any]:
    """`numbers` when they pass; GateError with a one-row attempts table otherwise. `hint`
    ends the message (what the user can do)."""
    if not numbers["passed"]:
        attempts = [{"excluded_groups": []} | gate_row(numbers)]
        message = f"{variant} misses the accuracy gate: {gate_summary(numbers)}"
        raise GateError(message + (f"; {hint}" if hint else ""), variant, attempts)
    return numbers
