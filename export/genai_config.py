"""onnxruntime-genai's description of a GPT bundle, so `onnxruntime_genai.Model(bundle)` runs
its `model.onnx` as is (type "decoder", greedy search; docs/bundle-lm.md).

    write_genai_config(model.cfg, "b")                # onnxruntime_genai.Model("b") loads it
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig


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
