"""Counting what crosses between host and device while a step model searches (the device
state tests): `OrtValue.numpy` (device -> host), `OrtValue.ortvalue_from_numpy` (host ->
device), and the step model's `select` and `_decoded` calls.

    calls = count_transfers(monkeypatch, step)
    search(step, src, GenerationOptions(beam_size=4))
    assert calls["numpy"] == calls["steps"] * calls["heads"]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort


def count_transfers(monkeypatch, step: Any) -> dict[str, int]:
    """Patch onnxruntime and `step` (for the test's duration) to count into the returned
    dict: "numpy", "from_numpy", "select", "steps" (`_decoded` calls) and "heads" (the
    number of outputs the last step read)."""
    calls = {"numpy": 0, "from_numpy": 0, "select": 0, "steps": 0, "heads": 0}
    to_host, from_host = ort.OrtValue.numpy, ort.OrtValue.ortvalue_from_numpy
    select, decoded = step.select, step._decoded

    def counted_numpy(value: ort.OrtValue) -> np.ndarray:
        calls["numpy"] += 1
        return to_host(value)

    def counted_from_numpy(*args: Any) -> ort.OrtValue:
        calls["from_numpy"] += 1
        return from_host(*args)

    def counted_select(state: Any, rows: np.ndarray) -> Any:
        calls["select"] += 1
        return select(state, rows)

    def counted_decoded(state: Any, input_ids: np.ndarray, heads: tuple[str, ...]) -> Any:
        calls["steps"] += 1
        calls["heads"] = len(heads)
        return decoded(state, input_ids, heads)

    monkeypatch.setattr(ort.OrtValue, "numpy", counted_numpy)
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", staticmethod(counted_from_numpy))
    monkeypatch.setattr(step, "select", counted_select)
    monkeypatch.setattr(step, "_decoded", counted_decoded)
    return calls
