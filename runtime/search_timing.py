"""Time a search through any engine behind the step interface: what `edgeseq bench` and the
export's variants table (its tokens/s column) measure.

    spec = BenchSpec(sources=[[7, 9, 2], ...], batch_sizes=(1, 32), repeats=3, threads=1)
    timings = time_search(step_model, spec)       # {"1": {...}, "32": {...}}

Every engine runs the same search (`runtime/search.py`) on the same source ids, sorted by
length and cut into batches of each batch size. Per batch size: one warm-up pass over every
input (not timed), then `repeats` timed passes. Reported per batch size:

- `tokens_per_s`: generated tokens / seconds of a pass, median over the passes. Generated
  tokens are those of each input's best hypothesis, plus one for `</s>` when it finished
  (what a decoder step produced and the caller receives);
- `seq_ms_p50`/`seq_ms_p90`: latency of one input = the time of the `search` call of its
  batch, percentiles over every input of every timed pass;
- `token_ms_p50`: a batch's time / its decoder steps (the gap between two streamed tokens).

`time_search` runs in the calling process; `threads` and `extra` describe the process a
spec is run in (`edgeseq bench` starts one per engine with them). This module imports only
numpy, the runtime and the standard library, so a torch-free process and a PyTorch one time
the same way.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import OptionsError
from .padding import right_pad
from .prefix import forced
from .search import GenerationOptions, search
from .step import StepModel, StepState


@dataclass
class BenchSpec:
    """What every engine runs: the same sources, batch sizes, search and thread count."""

    sources: list[list[int]]  # source ids, each ending with </s>
    batch_sizes: tuple[int, ...] = (1, 32)
    repeats: int = 3  # timed passes per batch size (the median is reported)
    threads: int = 1  # intra-op threads of every engine
    max_new_tokens: int | None = None  # None: up to the model's max_len
    beam_size: int = 1  # 1: greedy
    warmup: bool = True  # one untimed pass per batch size first
    target_prefix: tuple[int, ...] = ()  # ids forced first in every row (a target language)
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific (bundle, variant, ...)

    def problems(self) -> list[str]:
        """Every problem with this spec, as readable sentences."""
        out = []
        if not self.sources:
            out.append("there are no inputs to benchmark")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            out.append(f"batch sizes must be positive integers, got {list(self.batch_sizes)}")
        for name in ("repeats", "threads", "beam_size"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1, got {getattr(self, name)}")
        return out

    def check(self) -> BenchSpec:
        """Raise OptionsError naming every problem; return self."""
        problems = self.problems()
        if problems:
            raise OptionsError("invalid benchmark: " + "; ".join(problems))
        return self

    def options(self, batch_size: int) -> GenerationOptions:
        """GenerationOptions of this spec's search at `batch_size`; every other field set to
        edgeseq's default (`filled`), not a bundle's generation defaults: every engine runs
        the same search."""
        return GenerationOptions(
            max_new_tokens=self.max_new_tokens, beam_size=self.beam_size, batch_size=batch_size
        ).filled()

    def save(self, path: str | Path) -> None:
        """Write the spec as JSON."""
        Path(path).write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> BenchSpec:
        """Read a spec written by `save`."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        data["batch_sizes"] = tuple(data["batch_sizes"])
        data["target_prefix"] = tuple(data.get("target_prefix", ()))
        return cls(**data)


class CountingStep:
    """A StepModel that forwards to `model` and counts decoder steps (one call each)."""

    def __init__(self, model: StepModel) -> None:
        self.model = model
        self.max_len, self.vocab_size = model.max_len, model.vocab_size
        self.bos_id, self.eos_id, self.pad_id = model.bos_id, model.eos_id, model.pad_id
        self.steps = 0

    def start(self, src_ids: np.ndarray) -> StepState:
        """Encode (not counted)."""
        return self.model.start(src_ids)

    def step(self, state: StepState, input_ids: np.ndarray) -> tuple[np.ndarray, StepState]:
        """One decoder step (counted)."""
        self.steps += 1
        return self.model.step(state, input_ids)

    def select(self, state: StepState, rows: np.ndarray) -> StepState:
        """Row selection (not counted)."""
        return self.model.select(state, rows)


def batches(sources: Sequence[Sequence[int]], batch_size: int, pad_id: int) -> list[np.ndarray]:
    """Sources sorted by length (stable) in right-padded int64 (B, S_max) batches."""
    ordered = sorted(sources, key=len)
    return [
        right_pad(ordered[start : start + batch_size], pad_id)
        for start in range(0, len(ordered), batch_size)
    ]


def _pass(model: CountingStep, src_batches: list[np.ndarray], options: GenerationOptions) -> dict:
    """One pass over every batch: per batch (seconds, rows, tokens, steps)."""
    records = []
    for src_ids in src_batches:
        model.steps = 0
        start = time.perf_counter()
        hyps = search(model, src_ids, options)
        seconds = time.perf_counter() - start
        tokens = sum(len(h[0].tokens) + h[0].finished for h in hyps)
        records.append((seconds, src_ids.shape[0], tokens, model.steps))
    return {"batches": records}


def time_search(model: StepModel, spec: BenchSpec) -> dict[str, dict[str, Any]]:
    """Time `spec`'s search over `spec.sources` per batch size (see the module docstring);
    the garbage collector is off during timed passes; `spec.target_prefix` is forced first in
    every row, as `edgeseq generate` forces a multilingual bundle's target language."""
    counting = CountingStep(forced(model, [spec.target_prefix]))
    out = {}
    for batch_size in spec.batch_sizes:
        options = spec.options(batch_size)
        src_batches = batches(spec.sources, batch_size, model.pad_id)
        if spec.warmup:
            _pass(counting, src_batches, options)
        passes = []
        gc.collect()
        gc.disable()
        try:
            for _ in range(spec.repeats):
                passes.append(_pass(counting, src_batches, options)["batches"])
        finally:
            gc.enable()
        out[str(batch_size)] = summarize(passes)
    return out


def summarize(passes: list[list[tuple[float, int, int, int]]]) -> dict[str, Any]:
    """Statistics of timed passes, each a list of (seconds, rows, tokens, steps) per batch;
    the passes themselves are kept under "passes" (`edgeseq bench` merges rounds from them)."""
    rates = [sum(b[2] for b in p) / sum(b[0] for b in p) for p in passes]
    seq_ms = [1000 * b[0] for p in passes for b in p for _ in range(b[1])]
    token_ms = [1000 * b[0] / max(b[3], 1) for p in passes for b in p]
    return {
        "tokens_per_s": float(np.median(rates)),
        "tokens_per_s_runs": rates,
        "seq_ms_p50": float(np.percentile(seq_ms, 50)),
        "seq_ms_p90": float(np.percentile(seq_ms, 90)),
        "token_ms_p50": float(np.percentile(token_ms, 50)),
        "tokens": sum(b[2] for b in passes[0]),  # per pass (the same in every pass)
        "inputs": sum(b[1] for b in passes[0]),
        "seconds_per_pass": float(np.median([sum(b[0] for b in p) for p in passes])),
        "passes": [[list(b) for b in p] for p in passes],
    }
