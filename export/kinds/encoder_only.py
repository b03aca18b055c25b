"""The encoder-only kind (BERT) in export: the graph (`model.onnx`: hidden states and the
classification head's logits), its parity levels, and the hooks export/kinds/one_graph.py
calls to write and verify the bundle.

    info = export_bert(model, "b/model.onnx")         # encoder: hidden states + head logits

Parity: level 1 both outputs on random right-padded batches; level 2 the logits of the
held-out inputs; level 3 identical predicted labels (argmax over the non-special label ids).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.export import Dim

from edgeseq.build_model.encoder_only import EncoderOnlyTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.tokenizer import TokenizerPair

from ..heldout import HeldOut
from ..onnx_export import GraphInfo, export_module
from ..parity import MAX_REPORTED_MISMATCHES, TOLERANCE_FP32, max_abs_diff, top2
from .one_graph import (
    EXAMPLE_BATCH,
    EXAMPLE_NEW,
    Run,
    export_one_graph,
    random_ids,
    verify_one_graph,
)

NAME = "bert"  # manifest.json's "kind"


class OnnxBERT(nn.Module):
    """BERT graph: input_ids, attention_mask int64 [B, S] (tokens + </s>, right-padded) ->
    last_hidden_state float32 [B, S, D] and the classification head's logits [B, C]."""

    def __init__(self, model: EncoderOnlyTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """-> last_hidden_state (B, S, D), logits (B, C)."""
        return self.model.encode(input_ids, attention_mask)


def export_bert(
    model: EncoderOnlyTransformer,
    path: str | Path,
    opset: int | None = None,
    metadata: dict[str, str] | None = None,
) -> GraphInfo:
    """Write the BERT graph (see `OnnxBERT`) to `path`, with `metadata` in its
    metadata_props."""
    cfg = model.cfg
    b, s = Dim(C.BATCH, min=1), Dim(C.SEQUENCE_LENGTH, min=1, max=cfg.max_len)
    ids = random_ids(cfg, EXAMPLE_BATCH, EXAMPLE_NEW + 1)
    args = (ids, torch.ones_like(ids))
    shapes = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
    names = (C.BERT_INPUTS, C.BERT_OUTPUTS)
    return export_module(OnnxBERT(model), args, shapes, names, cfg, "bert", path, opset, metadata)


def torch_run(model: EncoderOnlyTransformer) -> Run:
    """The PyTorch model as a function of the graph's feeds, returning its outputs in order."""

    @torch.inference_mode()
    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        t = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in feeds.items()}
        hidden, logits = model.encode(t[C.INPUT_IDS], t[C.ATTENTION_MASK])
        return [hidden.numpy(), logits.numpy()]

    return run


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
                entry.update(step=0, torch_top2=top2(want[offset]), onnx_top2=top2(got[offset]))
                if texts is not None:
                    entry["source_text"] = texts[start + offset]
                mismatches.append(entry)
    level2 = {
        "passed": diff <= TOLERANCE_FP32,
        "rows": len(sources),
        "steps": 1,
        "max_abs_diff_cached": diff,
        "max_abs_diff_uncached": diff,
        "bound": TOLERANCE_FP32,
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


# -- the hooks of export/kinds/one_graph.py --------------------------------------------------
export_graph = export_bert
export = export_one_graph  # (source, out, options) -> manifest: the kind interface
verify = verify_one_graph  # (bundle, source, options) -> parity report


def graph_inputs(model: EncoderOnlyTransformer, held: HeldOut) -> list[list[int]]:
    """The held-out inputs as the graph takes them: as they are (ending with `</s>`)."""
    return held.sources


def parity_levels(
    model: EncoderOnlyTransformer,
    run: Run,
    sources: Sequence[Sequence[int]],
    texts: Sequence[str] | None,
    max_new_tokens: int | None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Levels 1, 2 and 3 of the graph (`run`) vs `model` (`max_new_tokens` does not apply)."""
    return bert_levels(model, run, sources, texts)


def outputs(
    model: EncoderOnlyTransformer, run: Run, inputs: list[list[int]], tokenizers: TokenizerPair
) -> list[str]:
    """Predicted label names of `inputs` (what the int8 gate compares)."""
    labels = np.concatenate(
        [
            predictions(run(bert_feeds(model.cfg, inputs[i : i + 64]))[1])
            for i in range(0, len(inputs), 64)
        ]
    )
    return [tokenizers.target.decode([int(i)]) for i in labels]


def write_extra_files(cfg: ModelConfig, directory: Path) -> None:
    """Nothing beyond the common files."""
