"""Parity evidence: do the exported graphs compute what the PyTorch model computes?

    engine = OrtStep.from_files("b/encoder.onnx", "b/decoder.onnx", model.cfg)
    report = run_parity(model, engine, sources)     # sources: held-out source id lists
    print(format_parity(report))                     # export/report.py
    check_parity(report)                            # ParityError carrying the report

Three levels, each reported with its numbers (level 1 is parity_graphs.py):
1. per graph: every output vs PyTorch over batch x src_len x past_len x new_len grids, the
   decoder fed cross and past K/V that PyTorch computed from random ids;
2. per step: decoder logits along a greedy decode, each row up to its `</s>`, vs PyTorch's
   cached `decode_step` and its uncached full `decode` of the same tokens, both within the
   tolerance plus PyTorch's own cached-vs-uncached difference (the orders of summation
   differ, in PyTorch too: its own difference is the fp32 noise at this model's logit
   scale, large where logits are, as T5's untied output gives them);
3. end to end: greedy sequences of `OrtStep` and `TorchStep` driven by the same
   `greedy_search`; a mismatch is reported with its first divergent step and top-2 logits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.build_model.torch_step import TorchStep
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.kinds.seq2seq import OrtStep
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import beam_search, greedy_search
from edgeseq.runtime.step import StepModel

from ...heap import release_free_heap
from ...parity import (
    MAX_REPORTED_MISMATCHES,
    NOISE_FACTOR,
    TOLERANCE_FP32,
    max_abs_diff,
    parity_report,
    single_thread,
    top2,
)
from .float64_noise import float64_twin, logits_noise, noise_bound
from .parity_graphs import level1_graphs

LEVEL2_ROWS = 8  # held-out inputs decoded together at level 2
LEVEL2_MAX_STEPS = 32
LEVEL3_BATCH = 32
# float32 logits of one step over every row of a parity batch (sources x beam): a batch of 32
# sources at beam 4 over NLLB-200's 256,206 rows would be 131 MB per copy, and a step makes
# several (the graph's, PyTorch's, the search's scores)
PARITY_LOGITS_BYTES = 64 * 2**20
LEVEL3_BEAM_SIZE = 4  # beam search is also compared, on the first LEVEL3_BEAM_INPUTS inputs
LEVEL3_BEAM_INPUTS = 50

Progress = Callable[[str], None]


def parity_batch(vocab_size: int, beam_size: int = 1) -> int:
    """Sources per batch of a parity search: LEVEL3_BATCH, fewer where one step's float32
    logits of every row (sources x `beam_size` x `vocab_size`) would pass
    PARITY_LOGITS_BYTES; at least one."""
    return max(1, min(LEVEL3_BATCH, PARITY_LOGITS_BYTES // (4 * vocab_size * beam_size)))


def cpu_session(path: Path) -> ort.InferenceSession:
    """A one-thread CPU session of the graph at `path`, errors only in the log (as
    `open_engine`'s): the extra graphs' parity groups run theirs on it."""
    return ort.InferenceSession(str(path), parity_options(), providers=["CPUExecutionProvider"])


def parity_options() -> ort.SessionOptions:
    """One intra-op thread, errors only in the log, the memory arena off (as the runtime's:
    an arena keeps the largest blocks level 3's batches asked for, over 1 GB at NLLB-200's
    vocabulary)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    options.enable_cpu_mem_arena = False
    return options


def open_engine(encoder: str | Path, decoder: str | Path, config: ModelConfig) -> OrtStep:
    """onnxruntime CPU sessions of both graphs (one intra-op thread) behind `OrtStep`."""
    return OrtStep.from_files(encoder, decoder, config, ["CPUExecutionProvider"], parity_options())


# -- level 2 ---------------------------------------------------------------------------------
def level2_steps(
    model: Seq2SeqTransformer, engine: OrtStep, sources: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """Decoder logits at every step of one greedy decode (driven by onnxruntime's arg-max,
    `<pad>` excluded so the uncached decode sees no padding) vs PyTorch cached and uncached.

    A row's steps count up to the one whose logits chose its `</s>`: after that, the search
    ignores the row, and the states past the end are ones the model was never trained on."""
    cfg = model.cfg
    src = right_pad(sources[:LEVEL2_ROWS], cfg.pad_id)
    rows = src.shape[0]
    steps = min(LEVEL2_MAX_STEPS, cfg.max_len)
    state = engine.start(src)
    with torch.no_grad():
        src_t = torch.from_numpy(src)
        keep = model.source_keep(src_t)
        memory = model.encode(src_t, keep)
        cross_k, cross_v = model.cross_kv(memory)
        past_k, past_v = model.empty_cache(rows, memory)
        tokens = np.full((rows, 1), cfg.start_id, dtype=np.int64)
        ended = np.zeros(rows, dtype=bool)
        ort_steps, cached_diffs, torch_steps, live_steps = [], [], [], []
        for _ in range(steps):
            last = tokens[:, -1:]
            ort_logits, state = engine.step(state, last)  # (B, 1, V)
            torch_logits, past_k, past_v = model.decode_step(
                torch.from_numpy(last), past_k, past_v, cross_k, cross_v, keep
            )
            rows_live = ~ended
            live_steps.append(rows_live)
            cached_diffs.append(
                max_abs_diff(torch_logits.numpy()[rows_live], ort_logits[rows_live])
            )
            torch_steps.append(torch_logits.numpy()[:, 0])
            ort_steps.append(ort_logits[:, 0])
            choice = ort_logits[:, -1].copy()
            choice[:, cfg.pad_id] = -np.inf
            chosen = choice.argmax(-1)
            tokens = np.concatenate([tokens, chosen[:, None]], axis=1)
            ended |= chosen == cfg.eos_id
            if ended.all():
                break
        run = len(ort_steps)
        live = np.stack(live_steps, axis=1)  # (B, run): the row had not ended before the step
        fed = torch.from_numpy(tokens[:, :run])  # <s> and the first run-1 choices
        uncached = model.decode(fed, memory, keep).numpy()[live]  # (live steps, V)
    ort_all = np.stack(ort_steps, axis=1)[live]  # (live steps, V)
    max_cached, max_uncached = max(cached_diffs), max_abs_diff(uncached, ort_all)
    torch_drift = max_abs_diff(uncached, np.stack(torch_steps, axis=1)[live])
    bound = TOLERANCE_FP32 + torch_drift
    extra: dict[str, float] = {}
    if max(max_cached, max_uncached) > bound:  # past it: PyTorch's own float32 error
        twin = float64_twin(model)
        noise = logits_noise(model, twin, src, tokens[:, :run], live)
        bound = max(bound, noise_bound(noise))
        extra |= {"float64_noise": noise, "noise_factor": NOISE_FACTOR}
    return extra | {
        "passed": max_cached <= bound and max_uncached <= bound,
        "rows": int(rows),
        "steps": run,
        "live_steps": int(live.sum()),
        "max_abs_diff_cached": max_cached,
        "max_abs_diff_uncached": max_uncached,
        "torch_cached_vs_uncached": torch_drift,
        "bound": bound,
        "worst_step": int(np.argmax(cached_diffs)),
    }


def first_divergence(
    reference: StepModel, candidate: StepModel, source: Sequence[int], a: list[int], b: list[int]
) -> dict[str, Any]:
    """Where sequences `a` (reference) and `b` (candidate) of `source` first differ, and both
    engines' top-2 logits at that step after the common prefix."""
    common = min(len(a), len(b))
    step = next((i for i in range(common) if a[i] != b[i]), common)
    prefix = np.array([[reference.bos_id, *a[:step]]], dtype=np.int64)  # (1, step + 1)
    src = np.array([list(source)], dtype=np.int64)
    tops = []
    for engine in (reference, candidate):
        logits, _ = engine.step(engine.start(src), prefix)
        tops.append(top2(logits[0, -1]))
    return {"step": step, "torch_top2": tops[0], "onnx_top2": tops[1]}


def level3_sequences(
    model: Seq2SeqTransformer,
    engine: OrtStep,
    sources: Sequence[Sequence[int]],
    max_new_tokens: int,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Greedy sequences from onnxruntime vs PyTorch (same `greedy_search`) on `sources`."""
    reference = TorchStep(model)
    identical, mismatches = 0, []
    batch = parity_batch(model.cfg.tgt_vocab_size)
    for start in range(0, len(sources), batch):
        chunk = sources[start : start + batch]
        src = right_pad(chunk, model.cfg.pad_id)
        expected = greedy_search(reference, src, max_new_tokens)
        got = greedy_search(engine, src, max_new_tokens)
        for offset, (want, have) in enumerate(zip(expected, got, strict=True)):
            if want == have:
                identical += 1
                continue
            if len(mismatches) < MAX_REPORTED_MISMATCHES:
                index = start + offset
                entry = {"index": index, "source_ids": list(map(int, sources[index]))}
                if texts is not None:
                    entry["source_text"] = texts[index]
                entry.update(torch_ids=want, onnx_ids=have)
                entry.update(first_divergence(reference, engine, sources[index], want, have))
                mismatches.append(entry)
    total = len(sources)
    beam = level3_beam(reference, engine, sources[:LEVEL3_BEAM_INPUTS], max_new_tokens)
    return {
        "passed": identical == total and total > 0 and beam["passed"],
        "inputs": total,
        "identical": identical,
        "identical_rate": identical / total if total else 0.0,
        "max_new_tokens": max_new_tokens,
        "mismatches": mismatches,
        "beam": beam,
    }


def level3_beam(
    reference: StepModel, engine: StepModel, sources: Sequence[Sequence[int]], max_new: int
) -> dict[str, Any]:
    """Best beam-search hypotheses (LEVEL3_BEAM_SIZE) of both engines on `sources`."""
    identical, differing = 0, []
    batch = parity_batch(reference.vocab_size, LEVEL3_BEAM_SIZE)
    for start in range(0, len(sources), batch):
        src = right_pad(sources[start : start + batch], reference.pad_id)
        expected = beam_search(reference, src, LEVEL3_BEAM_SIZE, max_new)
        got = beam_search(engine, src, LEVEL3_BEAM_SIZE, max_new)
        for offset, (want, have) in enumerate(zip(expected, got, strict=True)):
            if want[0].tokens == have[0].tokens:
                identical += 1
            elif len(differing) < MAX_REPORTED_MISMATCHES:
                entry = {"index": start + offset, "torch_ids": list(want[0].tokens)}
                differing.append(entry | {"onnx_ids": list(have[0].tokens)})
    return {
        "passed": identical == len(sources),
        "beam_size": LEVEL3_BEAM_SIZE,
        "inputs": len(sources),
        "identical": identical,
        "mismatches": differing,
    }


# -- all levels ------------------------------------------------------------------------------
def run_parity(
    model: Seq2SeqTransformer,
    engine: OrtStep,
    sources: Sequence[Sequence[int]],
    *,
    source_description: str = "random",
    texts: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Levels 1-3 of `engine` vs `model`; returns the report (does not raise)."""
    say = progress or (lambda _: None)
    model.eval()
    start = time.perf_counter()
    limit = max_new_tokens if max_new_tokens is not None else model.cfg.max_len
    with single_thread():
        say("parity level 1: every graph output over random shapes")
        level1 = level1_graphs(model, engine, seed)
        say("parity level 2: decoder logits along a greedy decode")
        level2 = level2_steps(model, engine, sources)
        release_free_heap()
        say(f"parity level 3: greedy sequences on {len(sources)} inputs ({source_description})")
        level3 = level3_sequences(model, engine, sources, limit, texts)
        release_free_heap()
    return parity_report(level1, level2, level3, source_description, start)
