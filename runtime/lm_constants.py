"""Names of the GPT and BERT bundles' graph (one `model.onnx` each), shared by export and
runtime; torch-free. The GPT names are Optimum's and onnxruntime-genai's for decoder-only
models, so `genai_config.json` points genai at the graph as is (docs/bundle.md).

    gpt_inputs(2)   # ("input_ids", "attention_mask", "position_ids",
                    #  "past_key_values.0.key", "past_key_values.0.value", ... layer 1)
    gpt_outputs(2)  # ("logits", "present.0.key", "present.0.value", "present.1.key", ...)
"""

from __future__ import annotations

MODEL_FILE = "model.onnx"  # the one graph of a GPT or BERT bundle
GENAI_CONFIG_FILE = "genai_config.json"  # onnxruntime-genai's description of a GPT bundle

# Architectures (ModelConfig.architecture) and the bundle kinds they export to.
ENCODER_DECODER = "encoder-decoder"
DECODER_ONLY = "decoder-only"
ENCODER_ONLY = "encoder-only"

# Inputs of both graphs.
INPUT_IDS = "input_ids"  # int64 [batch, sequence_length]
ATTENTION_MASK = "attention_mask"  # int64, 1 = real token: GPT [batch, total_sequence_length]
POSITION_IDS = "position_ids"  # GPT: int64 [batch, sequence_length], rows of the table
PAST_KEY = "past_key_values.%d.key"  # GPT: float32 [batch, n_heads, past_sequence_length, d_head]
PAST_VALUE = "past_key_values.%d.value"
# Outputs.
LOGITS = "logits"  # GPT: float32 [batch, sequence_length, vocab]; BERT: [batch, n_labels]
PRESENT_KEY = "present.%d.key"  # GPT: float32 [batch, n_heads, total_sequence_length, d_head]
PRESENT_VALUE = "present.%d.value"
LAST_HIDDEN_STATE = "last_hidden_state"  # BERT: float32 [batch, sequence_length, d_model]

# Dynamic axis names.
BATCH = "batch"
SEQUENCE_LENGTH = "sequence_length"
PAST_SEQUENCE_LENGTH = "past_sequence_length"
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"  # past_sequence_length + sequence_length


def past_names(n_layers: int) -> tuple[str, ...]:
    """past_key_values.0.key, past_key_values.0.value, past_key_values.1.key, ..."""
    return tuple(name % i for i in range(n_layers) for name in (PAST_KEY, PAST_VALUE))


def present_names(n_layers: int) -> tuple[str, ...]:
    """present.0.key, present.0.value, present.1.key, ..."""
    return tuple(name % i for i in range(n_layers) for name in (PRESENT_KEY, PRESENT_VALUE))


def gpt_inputs(n_layers: int) -> tuple[str, ...]:
    """The GPT graph's inputs in order: ids, mask, positions, then each layer's key, value."""
    return (INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *past_names(n_layers))


def gpt_outputs(n_layers: int) -> tuple[str, ...]:
    """The GPT graph's outputs in order: logits, then each layer's present key, value."""
    return (LOGITS, *present_names(n_layers))


BERT_INPUTS = (INPUT_IDS, ATTENTION_MASK)  # both int64 [batch, sequence_length]
BERT_OUTPUTS = (LAST_HIDDEN_STATE, LOGITS)
