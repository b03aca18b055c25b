"""The decoder-only kind (GPT) in export: the graph (`model.onnx`, a KV-cached decoder with
Optimum's and onnxruntime-genai's names), its parity levels, `genai_config.json`
(export/genai_config.py), and the hooks
export/kinds/one_graph.py calls to write and verify the bundle.

    info = export_gpt(model, "b/model.onnx")          # KV-cached decoder, Optimum/genai names

Names and axes are those of `runtime/constants.py`. As for the encoder–decoder
(export/onnx_export.py), the exporter is traced with sizes >= 2 on every dynamic axis, so a
past length of 0 (the prompt's first run) is tested after export, not traced.

Parity: level 1 every output on random inputs (past 0 and > 0, left padding, batch 1 and 3);
level 2 the logits of each step of a greedy continuation (PyTorch cached and uncached);
level 3 the greedy continuations of the held-out prompts, both engines via `greedy_loop`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.export import Dim

from edgeseq.build_model.decoder_only import DecoderOnlyTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.tokenizer import TokenizerPair

from ..external_data import load_graph, save_graph
from ..genai_config import write_genai_config
from ..heldout import HeldOut
from ..onnx_export import GraphInfo, export_module
from ..parity import MAX_REPORTED_MISMATCHES, TOLERANCE_FP32, max_abs_diff, top2
from .one_graph import (
    EXAMPLE_BATCH,
    EXAMPLE_NEW,
    LEVEL2_ROWS,
    Run,
    export_one_graph,
    random_ids,
    run_info,
    verify_one_graph,
)

NAME = "gpt"  # manifest.json's "kind"
EXAMPLE_PAST = 3  # >= 2, like one_graph.EXAMPLE_BATCH and EXAMPLE_NEW (module docstring)


class OnnxGPT(nn.Module):
    """GPT graph: N new tokens after P cached ones (P = 0 for a prompt's first run).

    Inputs:
        input_ids                 int64   [B, N]
        attention_mask            int64   [B, P+N]        1 at real tokens, 0 at pads
        position_ids              int64   [B, N]          rows of the positional table
        past_key_values.i.key     float32 [B, H, P, dh]   per layer i (and .value)
    Outputs:
        logits                    float32 [B, N, V]
        present.i.key             float32 [B, H, P+N, dh] past with the new tokens appended

    Slot j is visible from new slot i when j <= i and attention_mask[:, j] == 1 (and every slot
    sees itself). The graph does not check positions against max_len: the caller must.
    """

    def __init__(self, model: DecoderOnlyTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *past: Tensor
    ) -> tuple[Tensor, ...]:
        """-> logits (B, N, V), then present key, value of each layer (B, H, P+N, dh)."""
        past_k, past_v = past[0::2], past[1::2]
        logits, present_k, present_v = self.model.step(
            input_ids, position_ids, attention_mask, past_k, past_v
        )
        return (logits, *(t for pair in zip(present_k, present_v, strict=True) for t in pair))


def export_gpt(
    model: DecoderOnlyTransformer,
    path: str | Path,
    opset: int | None = None,
    metadata: dict[str, str] | None = None,
) -> GraphInfo:
    """Write the GPT graph (see `OnnxGPT`) to `path`, with `metadata` in its metadata_props."""
    cfg = model.cfg
    batch, past, new = EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_NEW
    b = Dim(C.BATCH, min=1)
    n = Dim(C.SEQUENCE_LENGTH, min=1, max=cfg.max_len)
    p = Dim(C.PAST_SEQUENCE_LENGTH, min=0, max=cfg.max_len)
    kv = torch.randn(batch, cfg.n_heads, past, cfg.d_head)
    args = (
        random_ids(cfg, batch, new),
        torch.ones(batch, past + new, dtype=torch.int64),
        (torch.arange(new) + past)[None].repeat(batch, 1),
        *(kv.clone() for _ in range(2 * cfg.n_decoder_layers)),
    )
    shapes: dict[str, Any] = {
        "input_ids": {0: b, 1: n},
        "attention_mask": {0: b, 1: Dim.AUTO},
        "position_ids": {0: b, 1: n},
        "past": tuple({0: b, 2: p} for _ in range(2 * cfg.n_decoder_layers)),
    }
    names = (C.gpt_inputs(cfg.n_decoder_layers), C.gpt_outputs(cfg.n_decoder_layers))
    info = export_module(OnnxGPT(model), args, shapes, names, cfg, "gpt", path, opset, metadata)
    _name_total_axis(Path(path))
    return run_info(info, Path(path))


def _name_total_axis(path: Path) -> None:
    """Name the past + new axis of the mask and the presents `total_sequence_length` (the
    exporter writes it as a sum or a fresh symbol)."""
    proto = load_graph(path)
    known = {C.BATCH, C.SEQUENCE_LENGTH, C.PAST_SEQUENCE_LENGTH}
    for value in (*proto.graph.input, *proto.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param and dim.dim_param not in known:
                dim.dim_param = C.TOTAL_SEQUENCE_LENGTH
    save_graph(proto, path)


def torch_run(model: DecoderOnlyTransformer) -> Run:
    """The PyTorch model as a function of the graph's feeds, returning its outputs in order."""

    @torch.inference_mode()
    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        t = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in feeds.items()}
        past = [t[name] for name in C.past_names(model.cfg.n_decoder_layers)]
        logits, k, v = model.step(
            t[C.INPUT_IDS], t[C.POSITION_IDS], t[C.ATTENTION_MASK], past[0::2], past[1::2]
        )
        return [logits.numpy(), *(a.numpy() for pair in zip(k, v, strict=True) for a in pair)]

    return run


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
        "passed": cached <= bound and uncached <= bound,
        "rows": len(prompts),
        "steps": steps,
        "max_abs_diff_cached": cached,
        "max_abs_diff_uncached": uncached,
        "torch_cached_vs_uncached": drift,
        "bound": bound,
    }


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
                entry.update(torch_top2=top2(want_steps[step][offset]))
                entry.update(onnx_top2=top2(got_steps[step][offset]))
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


# -- the hooks of export/kinds/one_graph.py --------------------------------------------------
export_graph = export_gpt
export = export_one_graph  # (source, out, options) -> manifest: the kind interface
verify = verify_one_graph  # (bundle, source, options) -> parity report


def graph_inputs(model: DecoderOnlyTransformer, held: HeldOut) -> list[list[int]]:
    """The held-out inputs as the graph takes them: prompts, without their `</s>`."""
    return [s[:-1] if s and s[-1] == model.cfg.eos_id else s for s in held.sources]


def parity_levels(
    model: DecoderOnlyTransformer,
    run: Run,
    sources: Sequence[Sequence[int]],
    texts: Sequence[str] | None,
    max_new_tokens: int | None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Levels 1, 2 and 3 of the graph (`run`) vs `model` on prompts `sources`."""
    limit = max_new_tokens if max_new_tokens is not None else model.cfg.max_len
    level1 = gpt_level1(model, run)
    level2 = gpt_level2(model, run, sources)
    return level1, level2, gpt_level3(model, run, sources, limit, texts)


def outputs(
    model: DecoderOnlyTransformer, run: Run, inputs: list[list[int]], tokenizers: TokenizerPair
) -> list[str]:
    """Greedy prompt + continuation texts of `inputs` (what the int8 gate compares)."""
    cfg, texts = model.cfg, []
    for i in range(0, len(inputs), 64):
        chunk = inputs[i : i + 64]
        found, _, _ = greedy_loop(run, cfg, chunk, cfg.max_len)
        texts += [tokenizers.target.decode([*p, *f]) for p, f in zip(chunk, found, strict=True)]
    return texts


def write_extra_files(cfg: ModelConfig, directory: Path) -> None:
    """genai_config.json, so onnxruntime-genai runs the bundle as is."""
    write_genai_config(cfg, directory)
