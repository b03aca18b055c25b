"""Names shared by export and runtime: graph inputs/outputs, dynamic axes, file names.

Inputs and outputs are always fed and read by these names, never by position.
"""

from __future__ import annotations

# Bundle files.
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FILE = "manifest.json"
BUNDLE_FORMAT_VERSION = 1

# Encoder graph.
SRC_IDS = "src_ids"  # int64 [batch, src_len]
MEMORY = "memory"  # float [batch, src_len, d_model]
CROSS_K = "cross_k"  # float [n_decoder_layers, batch, n_heads, src_len, d_head]
CROSS_V = "cross_v"  # float [n_decoder_layers, batch, n_heads, src_len, d_head]

# Decoder-step graph.
INPUT_IDS = "input_ids"  # int64 [batch, new_len]
PAST_K = "past_k"  # float [n_decoder_layers, batch, n_heads, past_len, d_head]
PAST_V = "past_v"  # float [n_decoder_layers, batch, n_heads, past_len, d_head]
SRC_MASK = "src_mask"  # bool [batch, src_len], True where the source token is real
LOGITS = "logits"  # float [batch, new_len, tgt_vocab]
PRESENT_K = "present_k"  # float [n_decoder_layers, batch, n_heads, past_len + new_len, d_head]
PRESENT_V = "present_v"  # same shape as PRESENT_K

ENCODER_INPUTS = (SRC_IDS,)
ENCODER_OUTPUTS = (MEMORY, CROSS_K, CROSS_V)
DECODER_INPUTS = (INPUT_IDS, PAST_K, PAST_V, CROSS_K, CROSS_V, SRC_MASK)
DECODER_OUTPUTS = (LOGITS, PRESENT_K, PRESENT_V)

# Dynamic axis names.
BATCH = "batch"
SRC_LEN = "src_len"
PAST_LEN = "past_len"
NEW_LEN = "new_len"
TOTAL_LEN = "total_len"  # past_len + new_len

# Special tokens, in id order: every edgeseq tokenizer has them at ids 0..3.
PAD = "<pad>"
BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
