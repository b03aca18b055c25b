"""Export the one graph of a GPT or BERT bundle (`model.onnx`) and GPT's `genai_config.json`.

    info = export_gpt(model, "b/model.onnx")          # KV-cached decoder, Optimum/genai names
    info = export_bert(model, "b/model.onnx")         # encoder: hidden states + head logits
    write_genai_config(model.cfg, "b")                # onnxruntime_genai.Model("b") loads it

Names and axes are those of `runtime/constants.py`. As for the encoder–decoder
(export/onnx_export.py), the exporter is traced with sizes >= 2 on every dynamic axis, so a
past length of 0 (the prompt's first run) is tested after export, not traced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import Tensor, nn
from torch.export import Dim

from edgeseq.build_model.lm import DecoderOnlyTransformer, EncoderOnlyTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.constants import SPECIAL_TOKENS

from .onnx_export import GraphInfo, _run, _value_info

EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_NEW = 2, 3, 4  # all >= 2 (see the module docstring)


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


class OnnxBERT(nn.Module):
    """BERT graph: input_ids, attention_mask int64 [B, S] (tokens + </s>, right-padded) ->
    last_hidden_state float32 [B, S, D] and the classification head's logits [B, C]."""

    def __init__(self, model: EncoderOnlyTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """-> last_hidden_state (B, S, D), logits (B, C)."""
        return self.model.encode(input_ids, attention_mask)


def _random_ids(cfg: ModelConfig, batch: int, length: int) -> Tensor:
    return torch.randint(len(SPECIAL_TOKENS), cfg.src_vocab_size, (batch, length))


def export_gpt(
    model: DecoderOnlyTransformer, path: str | Path, opset: int | None = None
) -> GraphInfo:
    """Write the GPT graph (see `OnnxGPT`) to `path`."""
    cfg = model.cfg
    batch, past, new = EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_NEW
    b = Dim(C.BATCH, min=1)
    n = Dim(C.SEQUENCE_LENGTH, min=1, max=cfg.max_len)
    p = Dim(C.PAST_SEQUENCE_LENGTH, min=0, max=cfg.max_len)
    kv = torch.randn(batch, cfg.n_heads, past, cfg.d_head)
    args = (
        _random_ids(cfg, batch, new),
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
    info = _run(OnnxGPT(model), args, shapes, names, cfg, "gpt", path, opset)
    _name_total_axis(Path(path))
    return _run_info(info, Path(path))


def _name_total_axis(path: Path) -> None:
    """Name the past + new axis of the mask and the presents `total_sequence_length` (the
    exporter writes it as a sum or a fresh symbol)."""
    proto = onnx.load(str(path))
    known = {C.BATCH, C.SEQUENCE_LENGTH, C.PAST_SEQUENCE_LENGTH}
    for value in (*proto.graph.input, *proto.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param and dim.dim_param not in known:
                dim.dim_param = C.TOTAL_SEQUENCE_LENGTH
    onnx.save_model(proto, str(path), save_as_external_data=False)


def _run_info(info: GraphInfo, path: Path) -> GraphInfo:
    """`info` with the inputs and outputs as saved at `path` now."""
    proto = onnx.load(str(path), load_external_data=False)
    info.inputs, info.outputs = _value_info(proto.graph.input), _value_info(proto.graph.output)
    info.bytes = path.stat().st_size
    return info


def export_bert(
    model: EncoderOnlyTransformer, path: str | Path, opset: int | None = None
) -> GraphInfo:
    """Write the BERT graph (see `OnnxBERT`) to `path`."""
    cfg = model.cfg
    b, s = Dim(C.BATCH, min=1), Dim(C.SEQUENCE_LENGTH, min=1, max=cfg.max_len)
    ids = _random_ids(cfg, EXAMPLE_BATCH, EXAMPLE_NEW + 1)
    args = (ids, torch.ones_like(ids))
    shapes = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
    return _run(
        OnnxBERT(model), args, shapes, (C.BERT_INPUTS, C.BERT_OUTPUTS), cfg, "bert", path, opset
    )


def genai_config(cfg: ModelConfig, filename: str = C.MODEL_FILE) -> dict[str, Any]:
    """onnxruntime-genai's `genai_config.json` for a GPT bundle (type "decoder", greedy)."""
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": filename,
        "head_size": cfg.d_head,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_heads,
        "num_hidden_layers": cfg.n_decoder_layers,
        "inputs": {
            "input_ids": C.INPUT_IDS,
            "attention_mask": C.ATTENTION_MASK,
            "position_ids": C.POSITION_IDS,
            "past_key_names": C.PAST_KEY,
            "past_value_names": C.PAST_VALUE,
        },
        "outputs": {
            "logits": C.LOGITS,
            "present_key_names": C.PRESENT_KEY,
            "present_value_names": C.PRESENT_VALUE,
        },
    }
    model = {
        "type": "decoder",
        "decoder": decoder,
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "pad_token_id": cfg.pad_id,
        "context_length": cfg.max_len,
        "vocab_size": cfg.tgt_vocab_size,
    }
    search = {
        "do_sample": False,
        "num_beams": 1,
        "num_return_sequences": 1,
        "max_length": cfg.max_len,
        "min_length": 0,
        "length_penalty": 1.0,
        "early_stopping": True,
        "no_repeat_ngram_size": 0,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 1,
        "top_p": 1.0,
        "diversity_penalty": 0.0,
        "past_present_share_buffer": False,
    }
    return {"model": model, "search": search}


def write_genai_config(cfg: ModelConfig, directory: str | Path) -> Path:
    """Write `genai_config.json` into `directory`; return its path."""
    path = Path(directory) / C.GENAI_CONFIG_FILE
    path.write_text(json.dumps(genai_config(cfg), indent=2, sort_keys=True) + "\n", "utf-8")
    return path
