"""Parity levels 1-3 of a GPT or BERT graph against PyTorch, in the report format of
export/verify.py (so `check_parity` and the report formatting serve all three kinds).

    report = run_lm_parity(model, session, prompts)     # prompts: held-out id lists
    check_parity(report)                                # ParityError naming the failed levels

GPT: level 1 compares every output on random inputs (past length 0 and > 0, left padding in
the mask, batch 1 and 3); level 2 the logits of every step of a greedy continuation (the graph
fed PyTorch's tokens, PyTorch cached and uncached); level 3 the greedy continuations of the
held-out prompts, each engine choosing its own tokens. BERT: level 1 both outputs on random
right-padded batches; level 2 the logits of the held-out inputs; level 3 identical predicted
labels (argmax over the non-special label ids). Both engines run through `greedy_loop`, a plain
numpy loop over a function with the graph's feeds and outputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from edgeseq.build_model.lm import DecoderOnlyTransformer, EncoderOnlyTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.padding import right_pad

from .parity_graphs import TOLERANCE_FP32, max_abs_diff
from .verify import single_thread

Run = Callable[[dict[str, np.ndarray]], list[np.ndarray]]  # graph feeds -> graph outputs
LEVEL2_ROWS = 8
MAX_REPORTED_MISMATCHES = 5


def torch_run(model: DecoderOnlyTransformer | EncoderOnlyTransformer) -> Run:
    """The PyTorch model as a function of the graph's feeds, returning its outputs in order."""

    @torch.inference_mode()
    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        t = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in feeds.items()}
        if isinstance(model, EncoderOnlyTransformer):
            hidden, logits = model.encode(t[C.INPUT_IDS], t[C.ATTENTION_MASK])
            return [hidden.numpy(), logits.numpy()]
        past = [t[name] for name in C.past_names(model.cfg.n_decoder_layers)]
        logits, k, v = model.step(
            t[C.INPUT_IDS], t[C.POSITION_IDS], t[C.ATTENTION_MASK], past[0::2], past[1::2]
        )
        return [logits.numpy(), *(a.numpy() for pair in zip(k, v, strict=True) for a in pair)]

    return run


def session_run(session: ort.InferenceSession) -> Run:
    """An onnxruntime session as a `Run` (outputs in graph order)."""
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: session.run(names, feeds)


def gpt_feeds(
    cfg: ModelConfig,
    ids: np.ndarray,
    mask: np.ndarray,
    positions: np.ndarray,
    past: Sequence[np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The GPT graph's feeds; `past` None = an empty cache (past length 0)."""
    batch = ids.shape[0]
    if past is None:
        empty = np.zeros((batch, cfg.n_heads, 0, cfg.d_head), dtype=np.float32)
        past = [empty] * (2 * cfg.n_decoder_layers)
    feeds = {C.INPUT_IDS: ids, C.ATTENTION_MASK: mask, C.POSITION_IDS: positions}
    return feeds | dict(zip(C.past_names(cfg.n_decoder_layers), past, strict=True))


def greedy_loop(
    run: Run,
    cfg: ModelConfig,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    forced: np.ndarray | None = None,
) -> tuple[list[list[int]], list[np.ndarray], np.ndarray]:
    """Greedy continuation of prompts (ids without `<s>`): `<s>` + right-padded prompts in one
    call, then one token per call. Returns the tokens per row (without `</s>`), the logits
    (B, V) of every step and the tokens chosen at every step (B, steps). With `forced`
    (B, T) the chosen tokens are those, not the argmax."""
    rows = right_pad([[cfg.bos_id, *p] for p in prompts], cfg.pad_id)
    lengths = np.array([len(p) + 1 for p in prompts])
    mask = (np.arange(rows.shape[1])[None] < lengths[:, None]).astype(np.int64)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    out = run(gpt_feeds(cfg, rows, mask, positions))
    logits = out[0][np.arange(len(prompts)), lengths - 1]  # (B, V) at each last real token
    budget = min(max_new_tokens, cfg.max_len - int(lengths.max()))
    tokens, steps, ended = [[] for _ in prompts], [logits], np.zeros(len(prompts), bool)
    chosen = []
    for t in range(budget):
        choice = logits.argmax(-1) if forced is None else forced[:, t]
        chosen.append(choice)
        for r, token in enumerate(choice):
            if not ended[r] and token != cfg.eos_id:
                tokens[r].append(int(token))
        ended |= choice == cfg.eos_id
        if ended.all() or t + 1 == budget or (forced is not None and t + 1 >= forced.shape[1]):
            break
        mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
        new = choice[:, None].astype(np.int64)
        out = run(gpt_feeds(cfg, new, mask, lengths[:, None] + t, out[1:]))
        logits = out[0][:, -1]
        steps.append(logits)
    return tokens, steps, np.stack(chosen, axis=1)


# -- GPT -----------------------------------------------------------------------------------
def gpt_level1(model: DecoderOnlyTransformer, run: Run, seed: int = 0) -> dict[str, Any]:
    """Every output of the graph vs PyTorch on random feeds: past 0 and > 0, batch 1 and 3,
    a left-padded mask."""
    cfg, rng, reference = model.cfg, np.random.default_rng(seed), torch_run(model)
    worst: dict[str, float] = {}
    cases = [(1, 0, 1), (3, 0, 5), (3, 4, 1), (3, 4, 3), (1, 6, 2)]  # (batch, past, new)
    for batch, past, new in cases:
        ids = rng.integers(len(SPECIAL_TOKENS), cfg.tgt_vocab_size, (batch, new))
        mask = np.ones((batch, past + new), np.int64)
        mask[0, : min(2, past)] = 0  # left padding in the first row
        positions = np.tile(np.arange(past, past + new), (batch, 1))
        shape = (batch, cfg.n_heads, past, cfg.d_head)
        caches = [rng.standard_normal(shape).astype(np.float32)
                  for _ in range(2 * cfg.n_decoder_layers)]  # fmt: skip
        feeds = gpt_feeds(cfg, ids, mask, positions, caches)
        names = C.gpt_outputs(cfg.n_decoder_layers)
        for name, want, got in zip(names, reference(feeds), run(feeds), strict=True):
            worst[name] = max(worst.get(name, 0.0), max_abs_diff(want, got))
    return {
        "passed": all(d <= TOLERANCE_FP32 for d in worst.values()),
        "graph": C.MODEL_FILE,
        "cases": len(cases),
        "shapes": [{"batch": b, "past_len": p, "new_len": n} for b, p, n in cases],
        "max_abs_diff": worst,
    }


def gpt_level2(
    model: DecoderOnlyTransformer, run: Run, prompts: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """Logits of every step of PyTorch's greedy continuation, the graph fed the same tokens,
    vs PyTorch cached (the same loop) and uncached (one pass over the whole sequence)."""
    cfg, prompts = model.cfg, list(prompts[:LEVEL2_ROWS])
    _, want, chosen = greedy_loop(torch_run(model), cfg, prompts, cfg.max_len)
    _, got, _ = greedy_loop(run, cfg, prompts, cfg.max_len, forced=chosen)
    steps = min(len(want), len(got))
    ended = np.zeros(len(prompts), bool)
    cached, uncached, drift = 0.0, 0.0, 0.0
    for t in range(steps):
        live = ~ended
        cached = max(cached, max_abs_diff(want[t][live], got[t][live]))
        ended |= chosen[:, t] == cfg.eos_id
    with torch.inference_mode():
        for r, prompt in enumerate(prompts):
            seq = [cfg.bos_id, *prompt, *chosen[r, : steps - 1].tolist()]
            full = model(None, torch.tensor([seq]))[0].numpy()[len(prompt) :]  # (steps, V)
            live = np.concatenate([[True], chosen[r, : steps - 1] != cfg.eos_id]).cumprod() > 0
            got_r = np.stack([g[r] for g in got[:steps]])[live]
            want_r = np.stack([w[r] for w in want[:steps]])[live]
            uncached = max(uncached, max_abs_diff(full[live], got_r))
            drift = max(drift, max_abs_diff(full[live], want_r))
    bound = TOLERANCE_FP32 + drift
    return {
        "passed": cached <= TOLERANCE_FP32 and uncached <= bound,
        "rows": len(prompts),
        "steps": steps,
        "max_abs_diff_cached": cached,
        "max_abs_diff_uncached": uncached,
        "torch_cached_vs_uncached": drift,
        "uncached_bound": bound,
    }


def _top2(logits: np.ndarray) -> list[list[float]]:
    order = np.argsort(-logits)[:2]
    return [[int(i), round(float(logits[i]), 6)] for i in order]


def gpt_level3(
    model: DecoderOnlyTransformer,
    run: Run,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Greedy continuations of every prompt, each engine choosing its own tokens."""
    cfg, identical, mismatches = model.cfg, 0, []
    for start in range(0, len(prompts), 64):
        chunk = list(prompts[start : start + 64])
        want, want_steps, _ = greedy_loop(torch_run(model), cfg, chunk, max_new_tokens)
        got, got_steps, _ = greedy_loop(run, cfg, chunk, max_new_tokens)
        for offset, (a, b) in enumerate(zip(want, got, strict=True)):
            if a == b:
                identical += 1
                continue
            if len(mismatches) < MAX_REPORTED_MISMATCHES:
                step = next(
                    (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                    min(len(a), len(b)),
                )
                entry = {"index": start + offset, "source_ids": list(map(int, chunk[offset]))}
                if texts is not None:
                    entry["source_text"] = texts[start + offset]
                entry.update(torch_ids=a, onnx_ids=b, step=step)
                step = min(step, len(want_steps) - 1, len(got_steps) - 1)
                entry.update(torch_top2=_top2(want_steps[step][offset]))
                entry.update(onnx_top2=_top2(got_steps[step][offset]))
                mismatches.append(entry)
    total = len(prompts)
    return {
        "passed": identical == total and total > 0,
        "inputs": total,
        "identical": identical,
        "identical_rate": identical / total if total else 0.0,
        "max_new_tokens": max_new_tokens,
        "mismatches": mismatches,
    }


# -- BERT ----------------------------------------------------------------------------------
def bert_feeds(cfg: ModelConfig, sources: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """input_ids right-padded (sources end with `</s>`) and their attention_mask."""
    ids = right_pad(sources, cfg.pad_id)
    return {C.INPUT_IDS: ids, C.ATTENTION_MASK: (ids != cfg.pad_id).astype(np.int64)}


def predictions(logits: np.ndarray) -> np.ndarray:
    """Label id per row: 4 + argmax over the non-special label logits (B, C) -> (B,)."""
    return logits[:, len(SPECIAL_TOKENS) :].argmax(-1) + len(SPECIAL_TOKENS)


def bert_levels(
    model: EncoderOnlyTransformer,
    run: Run,
    sources: Sequence[Sequence[int]],
    texts: Sequence[str] | None = None,
    seed: int = 0,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Levels 1 (random batches), 2 (held-out logits) and 3 (identical predictions)."""
    cfg, rng, reference = model.cfg, np.random.default_rng(seed), torch_run(model)
    worst: dict[str, float] = {}
    for batch, length in ((1, 1), (3, 7), (2, cfg.max_len)):
        rows = [rng.integers(len(SPECIAL_TOKENS), cfg.src_vocab_size, rng.integers(1, length + 1))
                for _ in range(batch)]  # fmt: skip
        feeds = bert_feeds(cfg, [[*r[: cfg.max_len - 1], cfg.eos_id] for r in rows])
        for name, want, got in zip(C.BERT_OUTPUTS, reference(feeds), run(feeds), strict=True):
            worst[name] = max(worst.get(name, 0.0), max_abs_diff(want, got))
    level1 = {"passed": all(d <= TOLERANCE_FP32 for d in worst.values()), "graph": C.MODEL_FILE}
    level1.update(cases=3, max_abs_diff=worst)
    diff, identical, mismatches = 0.0, 0, []
    for start in range(0, len(sources), 64):
        feeds = bert_feeds(cfg, sources[start : start + 64])
        want, got = reference(feeds)[1], run(feeds)[1]
        diff = max(diff, max_abs_diff(want, got))
        for offset, (a, b) in enumerate(zip(predictions(want), predictions(got), strict=True)):
            identical += int(a == b)
            if a != b and len(mismatches) < MAX_REPORTED_MISMATCHES:
                entry = {
                    "index": start + offset,
                    "source_ids": list(map(int, sources[start + offset])),
                }
                entry.update(torch_ids=[int(a)], onnx_ids=[int(b)])
                entry.update(step=0, torch_top2=_top2(want[offset]), onnx_top2=_top2(got[offset]))
                if texts is not None:
                    entry["source_text"] = texts[start + offset]
                mismatches.append(entry)
    level2 = {
        "passed": diff <= TOLERANCE_FP32,
        "rows": len(sources),
        "steps": 1,
        "max_abs_diff_cached": diff,
        "max_abs_diff_uncached": diff,
        "uncached_bound": TOLERANCE_FP32,
    }
    total = len(sources)
    level3 = {
        "passed": identical == total and total > 0,
        "inputs": total,
        "identical": identical,
        "identical_rate": identical / total if total else 0.0,
        "mismatches": mismatches,
    }
    return level1, level2, level3


def run_lm_parity(
    model: DecoderOnlyTransformer | EncoderOnlyTransformer,
    run: Run,
    sources: Sequence[Sequence[int]],
    *,
    source_description: str = "random",
    texts: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
) -> dict[str, Any]:
    """Levels 1-3 of a GPT or BERT graph (`run`) vs `model`, as export/verify.run_parity
    reports them. GPT `sources` are prompts (ids without `<s>`), BERT ones end with `</s>`."""
    model.eval()
    start = time.perf_counter()
    with single_thread():
        if isinstance(model, EncoderOnlyTransformer):
            level1, level2, level3 = bert_levels(model, run, sources, texts)
        else:
            limit = max_new_tokens if max_new_tokens is not None else model.cfg.max_len
            level1 = gpt_level1(model, run)
            level2 = gpt_level2(model, run, sources)
            level3 = gpt_level3(model, run, sources, limit, texts)
    level3["source"] = source_description
    return {
        "variant": "fp32",
        "tolerance": TOLERANCE_FP32,
        "passed": level1["passed"] and level2["passed"] and level3["passed"],
        "level1": level1,
        "level2": level2,
        "level3": level3,
        "seconds": round(time.perf_counter() - start, 2),
    }
