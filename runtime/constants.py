"""Names shared by export and runtime: model kinds, graph inputs/outputs, dynamic axes, file
names, for the three kinds of bundle.

Inputs and outputs are always fed and read by these names, never by position.

    gpt_inputs(2)   # ("input_ids", "attention_mask", "position_ids",
                    #  "past_key_values.0.key", "past_key_values.0.value", ... layer 1)
    gpt_outputs(2)  # ("logits", "present.0.key", "present.0.value", "present.1.key", ...)
"""

from __future__ import annotations

# Model kinds (ModelConfig.architecture): the encoder–decoder's two graphs, or one graph.
ENCODER_DECODER = "encoder-decoder"
DECODER_ONLY = "decoder-only"  # GPT
ENCODER_ONLY = "encoder-only"  # BERT

# Bundle files.
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FILE = "manifest.json"
# Oldest onnxruntime that runs a bundle exported with fused attention (com.microsoft
# MultiHeadAttention): earlier releases give wrong outputs for padded batches (measured with
# the g2p-en bundle: 1.20.1 changed "hello" in a batch of three; docs/bundle.md). The
# manifest's MANIFEST_FUSED_ATTENTION field says whether a bundle was (`edgeseq export`
# without --no-fuse).
MIN_ORT_FUSED_ATTENTION = "1.21.0"
MANIFEST_FUSED_ATTENTION = "fused_attention"
BUNDLE_FORMAT_VERSION = 2  # 2: one K/V tensor per decoder layer (1: stacked over layers)

# Encoder graph. Cross-attention K/V and the self-attention cache are one tensor per decoder
# layer, named "<family>.<layer>" ("cross_k.0" .. "cross_k.{L-1}"): a graph that received them
# stacked over layers would copy every layer's slice out of the stack at every step.
SRC_IDS = "src_ids"  # int64 [batch, src_len]
MEMORY = "memory"  # float [batch, src_len, d_model]
CROSS_K = "cross_k"  # family: float [batch, n_heads, src_len, d_head] per decoder layer
CROSS_V = "cross_v"  # family: float [batch, n_heads, src_len, d_head] per decoder layer

# Decoder-step graph.
INPUT_IDS = "input_ids"  # int64 [batch, new_len]
PAST_K = "past_k"  # family: float [batch, n_heads, past_len, d_head] per decoder layer
PAST_V = "past_v"  # family: float [batch, n_heads, past_len, d_head] per decoder layer
SRC_MASK = "src_mask"  # bool [batch, src_len], True where the source token is real
LOGITS = "logits"  # float [batch, new_len, tgt_vocab]
PRESENT_K = "present_k"  # family: float [batch, n_heads, past_len + new_len, d_head] per layer
PRESENT_V = "present_v"  # family: same shape as PRESENT_K

ENCODER_INPUTS = (SRC_IDS,)
# Output families in report order (a family stands for its per-layer tensors).
ENCODER_FAMILIES = (MEMORY, CROSS_K, CROSS_V)
DECODER_FAMILIES = (LOGITS, PRESENT_K, PRESENT_V)
KV_FAMILIES = (CROSS_K, CROSS_V, PAST_K, PAST_V, PRESENT_K, PRESENT_V)


def layer_names(family: str, n_layers: int) -> tuple[str, ...]:
    """Graph names of one K/V family: ("past_k.0", ..., "past_k.{n_layers-1}")."""
    return tuple(f"{family}.{i}" for i in range(n_layers))


def family(name: str) -> str:
    """The family of a graph name: "present_k.3" -> "present_k", "logits" -> "logits"."""
    return name.split(".", 1)[0]


def encoder_outputs(n_layers: int) -> tuple[str, ...]:
    """memory, then cross_k.0.., then cross_v.0.."""
    return (MEMORY, *layer_names(CROSS_K, n_layers), *layer_names(CROSS_V, n_layers))


def decoder_inputs(n_layers: int) -> tuple[str, ...]:
    """input_ids, past_k.0.., past_v.0.., cross_k.0.., cross_v.0.., src_mask."""
    kv = (PAST_K, PAST_V, CROSS_K, CROSS_V)
    return (INPUT_IDS, *(n for f in kv for n in layer_names(f, n_layers)), SRC_MASK)


def decoder_outputs(n_layers: int) -> tuple[str, ...]:
    """logits, present_k.0.., present_v.0.."""
    return (LOGITS, *layer_names(PRESENT_K, n_layers), *layer_names(PRESENT_V, n_layers))


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

# One-graph search variant (a com.microsoft BeamSearch node; docs/bundle.md).
# graph variant -> file ("ort": the ORT-format conversion of search.onnx)
SEARCH_FILES = {"fp32": "search.onnx", "int8": "search.int8.onnx", "ort": "search.ort"}
SEARCH_INPUT_IDS = "input_ids"  # int32 [batch, src_len]
SEARCH_MAX_LENGTH = "max_length"  # int32 [1]: max_new_tokens + 1 (the leading <s> counts)
SEARCH_MIN_LENGTH = "min_length"  # int32 [1]
SEARCH_NUM_BEAMS = "num_beams"  # int32 [1]
SEARCH_NUM_RETURN = "num_return_sequences"  # int32 [1]
SEARCH_LENGTH_PENALTY = "length_penalty"  # float [1]
SEARCH_REPETITION_PENALTY = "repetition_penalty"  # float [1]
SEARCH_ATTENTION_MASK = "attention_mask"  # int32 [batch, src_len], 1 at real tokens
SEARCH_SEQUENCES = "sequences"  # int32 [batch, num_return_sequences, max_length]
SEARCH_OUTPUT_PAD = -1  # fills `sequences` after a hypothesis's last token
SEARCH_SCORES = "sequences_scores"  # float [batch, num_return_sequences]
SEARCH_INPUT_NAMES = (  # the BeamSearch node's inputs, in its order
    SEARCH_INPUT_IDS,
    SEARCH_MAX_LENGTH,
    SEARCH_MIN_LENGTH,
    SEARCH_NUM_BEAMS,
    SEARCH_NUM_RETURN,
    SEARCH_LENGTH_PENALTY,
    SEARCH_REPETITION_PENALTY,
    SEARCH_ATTENTION_MASK,
)


# Decoder-only and encoder-only bundles: one graph, `model.onnx`. The GPT names are Optimum's
# and onnxruntime-genai's for decoder-only models, so `genai_config.json` points genai at the
# graph as is (docs/bundle-lm.md).
MODEL_FILE = "model.onnx"
GENAI_CONFIG_FILE = "genai_config.json"  # onnxruntime-genai's description of a GPT bundle
ATTENTION_MASK = "attention_mask"  # int64, 1 = real token: GPT [batch, total_sequence_length]
POSITION_IDS = "position_ids"  # GPT: int64 [batch, sequence_length], rows of the table
PAST_KEY = "past_key_values.%d.key"  # GPT: float [batch, n_heads, past_sequence_length, d_head]
PAST_VALUE = "past_key_values.%d.value"
PRESENT_KEY = "present.%d.key"  # GPT: float [batch, n_heads, total_sequence_length, d_head]
PRESENT_VALUE = "present.%d.value"
LAST_HIDDEN_STATE = "last_hidden_state"  # BERT: float32 [batch, sequence_length, d_model]
# `input_ids` (INPUT_IDS) is int64 [batch, sequence_length] in both; `logits` (LOGITS) is
# GPT float32 [batch, sequence_length, vocab], BERT [batch, n_labels].
SEQUENCE_LENGTH = "sequence_length"
PAST_SEQUENCE_LENGTH = "past_sequence_length"
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"  # past_sequence_length + sequence_length


def past_names(n_layers: int) -> tuple[str, ...]:
    """past_key_values.0.key, past_key_values.0.value, past_key_values.1.key, ..."""
    return tuple(name % i for i in range(n_layers) for name in (PAST_KEY, PAST_VALUE))


def present_names(n_layers: int) -> tuple[str, ...]:
    """present.0.key, present.0.value, present.1.key, ..."""
    return tuple(name % i for i in range(n_layers) for name in (PRESENT_KEY, PRESENT_VALUE))


def is_cache(name: str) -> bool:
    """Whether graph input or output `name` is part of a decoder's cache (float16 in fp16
    graphs, float32 otherwise): the encoder–decoder's cross_k/v, past_k/v and present_k/v
    families, GPT's past_key_values.* and present.*."""
    return family(name) in KV_FAMILIES or name.startswith(("past_key_values.", "present."))


def gpt_inputs(n_layers: int) -> tuple[str, ...]:
    """The GPT graph's inputs in order: ids, mask, positions, then each layer's key, value."""
    return (INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *past_names(n_layers))


def gpt_outputs(n_layers: int) -> tuple[str, ...]:
    """The GPT graph's outputs in order: logits, then each layer's present key, value."""
    return (LOGITS, *present_names(n_layers))


BERT_INPUTS = (INPUT_IDS, ATTENTION_MASK)  # both int64 [batch, sequence_length]
BERT_OUTPUTS = (LAST_HIDDEN_STATE, LOGITS)


# Step-batching variant (optional, `--variants ...,steps`; docs/bundle.md): another decoder-step
# graph with the inputs of `decoder.onnx` plus per-row positions and a self-attention key
# mask, so that the rows of one batch can be at different positions (continuous batching).
STEPS_FILES = {
    "fp32": "decoder.steps.onnx",
    "int8": "decoder.steps.int8.onnx",
    "fp16": "decoder.steps.fp16.onnx",
}
TGT_MASK = "tgt_mask"  # bool [batch, past_len + new_len], True at cache slots a row may attend to
STEPS_TOTAL_LEN = f"{PAST_LEN} + {NEW_LEN}"  # the mask's axis, as decoder.onnx names `present_*`'s
# POSITION_IDS: int64 [batch, new_len], the positional table rows of the new tokens


def steps_decoder_inputs(n_layers: int) -> tuple[str, ...]:
    """decoder_inputs, then position_ids and tgt_mask."""
    return (*decoder_inputs(n_layers), POSITION_IDS, TGT_MASK)


# In-place cache variant (optional, `--variants ...,inplace`; docs/bundle.md): a decoder-step
# graph for one new token per row whose self-attention cache is a preallocated buffer bound as
# both past_k.i and present_k.i (a com.microsoft DecoderMaskedMultiHeadAttention node writes
# the new key and value at past_length), and whose beam reordering is a cache indirection.
IN_PLACE_FILES = {
    "fp32": "decoder.inplace.onnx",
    "int8": "decoder.inplace.int8.onnx",
    "fp16": "decoder.inplace.fp16.onnx",
}
CACHE_LEN = "cache_len"  # the buffers' position axis (>= past_len + 1)
CACHE_MASK = "cache_mask"  # int32 [batch, attended_len], 1 at the slots a row may attend to
PAST_LENGTH = "past_length"  # int32 [1]: positions already in the buffers (the new token's)
BEAM_WIDTH = "beam_width"  # int32 [1]: rows per input (1: no indirection is read)
CACHE_INDIRECTION = "cache_indirection"  # int32 [inputs, beams, cache_len]
ATTENDED_LEN = "attended_len"  # cache_mask's axis: past_length + 1
INPUTS, BEAMS = "inputs", "beams"  # cache_indirection's: batch / beam_width, beam_width


def in_place_decoder_inputs(n_layers: int) -> tuple[str, ...]:
    """decoder_inputs, then cache_mask, past_length, beam_width and cache_indirection."""
    return (*decoder_inputs(n_layers), CACHE_MASK, PAST_LENGTH, BEAM_WIDTH, CACHE_INDIRECTION)


# The search's outputs of the decoder graphs (`decoder.onnx`, `decoder.inplace.onnx`;
# docs/bundle.md): what greedy and beam search read instead of the whole `logits`, for the
# last new position of each row. Graphs exported before them have none: the runtime then
# reads `logits`.
TOPK_IDS = "topk_ids"  # int64 [batch, topk]: the topk largest logits' ids, largest first
TOPK_LOGITS = "topk_logits"  # float [batch, topk]: those logits (ties: the lower id first)
# float [batch]: log(sum(exp(logits - max logit))); log-probability = logit - max - this
LOG_NORMALIZER = "log_normalizer"
TOP_OUTPUTS = (TOPK_IDS, TOPK_LOGITS, LOG_NORMALIZER)
TOP_NODE_PREFIX = "edgeseq.top/"  # names of the nodes (and constants) that compute them
# (fp16 graphs keep these nodes in float32, reading float32 logits: export/convert.py)
TOPK = "topk"  # the axis: min(TOPK_MAX, tgt_vocab), fixed at export
TOPK_MAX = 32  # 2 x beam for beam sizes up to 16 (larger beams read the logits)


def topk_width(vocab_size: int) -> int:
    """The width of `topk_ids`/`topk_logits` a graph of this target vocabulary has."""
    return min(TOPK_MAX, vocab_size)


def optional_outputs(outputs: set[str] | frozenset[str]) -> tuple[str, ...]:
    """The search's outputs when a decoder graph with `outputs` has all of them (a graph
    may have them or not: bundles exported before them have none), else ()."""
    return TOP_OUTPUTS if set(TOP_OUTPUTS) <= outputs else ()
