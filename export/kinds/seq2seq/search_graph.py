"""The one-graph search variant: a `com.microsoft.BeamSearch` node around both bundle graphs.

    info = write_search_graph(bundle_dir / "encoder.onnx", bundle_dir / "decoder.onnx",
                              config, bundle_dir / "search.onnx")

Any onnxruntime binding (C++, C#, Java, Node, the browser, Triton) then generates with one
`session.run` and the tokenizer: no cache handling, no search loop. onnxruntime's operator
runs a T5-style encoder–decoder (`model_type` 1) given two subgraphs with a fixed contract
(onnxruntime's `contrib_ops/cpu/transformers/subgraph_t5_{encoder,decoder}.cc`). The
subgraphs are the bundle's own exported graphs (fp32 or int8, so every parity level already
measured on them still holds) with thin adapters added at their edges:

    encoder subgraph  encoder_input_ids int32 [B, S], encoder_attention_mask int32 [B, S]
                      -> present_key_cross_i, present_value_cross_i  float [B, H, S, dh]
                      (ids where the mask is 0 become <pad>; `memory` is not an output)
    decoder subgraph  input_ids int32 [B, 1], encoder_attention_mask int32 [B, S],
                      past_key_self_i, past_value_self_i  float [B, H, P, dh]   (P = 0 first)
                      past_key_cross_i, past_value_cross_i float [B, H, S, dh]
                      -> logits float [B, 1, V], present_key_self_i, present_value_self_i

Heads, head size and vocabulary are fixed numbers in the subgraphs' output shapes (the
operator reads them from there). The two graphs hold disjoint weights (cross-attention K/V
projections live only in the encoder graph; the decoder receives their outputs), so every
weight is stored once; an initializer that both graphs carry byte for byte is moved into the
outer graph, where both subgraphs read it. The outer graph's inputs are `SEARCH_INPUTS`.
The operator's `pad_token_id` is -1, not the model's <pad>: it only pads `sequences` after a
hypothesis ends (the attention mask is always fed), and a model may generate <pad> itself.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.vocabulary import METADATA_KEYS

from ...external_data import graph_bytes, load_graph, save_graph
from ...onnx_export import ExportError, edgeseq_version
from ...top_outputs import strip_top_outputs

MS_DOMAIN = "com.microsoft"
SHARED_MIN_BYTES = 1024  # smaller duplicates (shape constants) stay where they are

# Outer-graph inputs, in the BeamSearch node's input order, with what they mean.
SEARCH_INPUTS: dict[str, dict[str, Any]] = {
    C.SEARCH_INPUT_IDS: {
        "dtype": "int32",
        "shape": [C.BATCH, C.SRC_LEN],
        "meaning": "source ids: the tokenizer's ids of each input plus </s>, right-padded with "
        "<pad>",
    },
    C.SEARCH_MAX_LENGTH: {
        "dtype": "int32",
        "shape": [1],
        "meaning": "longest output sequence, counting the leading <s>: max_new_tokens + 1, at "
        "most max_len + 1",
    },
    C.SEARCH_MIN_LENGTH: {
        "dtype": "int32",
        "shape": [1],
        "meaning": "shortest output sequence counting <s> (</s> is forbidden before it); 0",
    },
    C.SEARCH_NUM_BEAMS: {
        "dtype": "int32",
        "shape": [1],
        "meaning": "beam size; 1 is greedy search",
    },
    C.SEARCH_NUM_RETURN: {
        "dtype": "int32",
        "shape": [1],
        "meaning": "hypotheses returned per input, best first (<= num_beams)",
    },
    C.SEARCH_LENGTH_PENALTY: {
        "dtype": "float32",
        "shape": [1],
        "meaning": "hypotheses rank by logprob / (tokens + 1) ** length_penalty; 1.0",
    },
    C.SEARCH_REPETITION_PENALTY: {
        "dtype": "float32",
        "shape": [1],
        "meaning": "1.0 (no penalty); the Python runtime has no repetition penalty",
    },
    C.SEARCH_ATTENTION_MASK: {
        "dtype": "int32",
        "shape": [C.BATCH, C.SRC_LEN],
        "meaning": "1 at real source tokens, 0 at padding (needed for right-padded batches)",
    },
}
SEARCH_OUTPUTS: dict[str, dict[str, Any]] = {
    C.SEARCH_SEQUENCES: {
        "dtype": "int32",
        "shape": [C.BATCH, "num_return_sequences", "max_length"],
        "meaning": "generated ids: <s> first, </s> left out, then -1 to the end (a generated "
        "<pad> stays distinguishable)",
    },
    C.SEARCH_SCORES: {
        "dtype": "float32",
        "shape": [C.BATCH, "num_return_sequences"],
        "meaning": "each hypothesis's logprob / (tokens + 1) ** length_penalty",
    },
}
_ONNX_TYPES = {"int32": TensorProto.INT32, "float32": TensorProto.FLOAT}


@dataclass
class SearchGraphInfo:
    """What `write_search_graph` wrote."""

    path: Path
    bytes: int
    seconds: float
    shared_initializers: int  # initializers both subgraphs carried, now stored once
    shared_bytes: int


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Point every node input named `old` at `new` (the graph has no nested subgraphs)."""
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                raise ExportError(f"graph node {node.name} has a subgraph; cannot adapt it")
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    for value in graph.value_info:
        if value.name == old:
            value.name = new


def _kv_info(name: str, cfg: ModelConfig, length: str, dtype: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, ["batch", cfg.n_heads, length, cfg.d_head])


def _float_type(graph: onnx.GraphProto, name: str) -> int:
    """Element type of graph output `name` (float32, or float16 for fp16 graphs)."""
    return next(v.type.tensor_type.elem_type for v in graph.output if v.name == name)


def encoder_subgraph(encoder: onnx.ModelProto, cfg: ModelConfig) -> onnx.GraphProto:
    """The bundle's encoder graph with the operator's encoder interface (module docstring)."""
    graph = onnx.GraphProto()
    graph.CopyFrom(encoder.graph)
    layers = cfg.n_decoder_layers
    kv_type = _float_type(graph, f"{C.CROSS_K}.0")
    del graph.input[:]
    graph.input.extend(
        [
            helper.make_tensor_value_info("encoder_input_ids", TensorProto.INT32, ["batch", "S"]),
            helper.make_tensor_value_info(
                "encoder_attention_mask", TensorProto.INT32, ["batch", "S"]
            ),
        ]
    )
    pad = numpy_helper.from_array(np.array(cfg.pad_id, dtype=np.int64), "search.pad_id")
    adapters = [
        helper.make_node("Cast", ["encoder_input_ids"], ["search.ids"], to=TensorProto.INT64),
        helper.make_node("Cast", ["encoder_attention_mask"], ["search.keep"], to=TensorProto.BOOL),
        helper.make_node("Where", ["search.keep", "search.ids", "search.pad_id"], [C.SRC_IDS]),
    ]
    outputs = []
    for i in range(layers):
        for family, role in ((C.CROSS_K, "key"), (C.CROSS_V, "value")):
            name = f"present_{role}_cross_{i}"
            adapters.append(helper.make_node("Identity", [f"{family}.{i}"], [name]))
            outputs.append(_kv_info(name, cfg, "S", kv_type))
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(adapters[:3] + nodes + adapters[3:])
    graph.initializer.append(pad)
    del graph.output[:]
    graph.output.extend(outputs)
    graph.name = "encoder"
    return graph


def decoder_subgraph(decoder: onnx.ModelProto, cfg: ModelConfig) -> onnx.GraphProto:
    """The bundle's decoder-step graph with the operator's decoder interface."""
    graph = onnx.GraphProto()
    graph.CopyFrom(decoder.graph)
    strip_top_outputs(graph)  # the operator reads logits
    layers = cfg.n_decoder_layers
    kv_type = _float_type(graph, f"{C.PRESENT_K}.0")
    _rename_uses(graph, C.INPUT_IDS, "search.input_ids")  # the operator's name is taken
    inputs = [
        helper.make_tensor_value_info(C.INPUT_IDS, TensorProto.INT32, ["batch", 1]),
        helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT32, ["batch", "S"]),
    ]
    adapters = [
        helper.make_node("Cast", [C.INPUT_IDS], ["search.input_ids"], to=TensorProto.INT64),
        helper.make_node("Cast", ["encoder_attention_mask"], [C.SRC_MASK], to=TensorProto.BOOL),
    ]
    for kind, families, length in (
        ("self", (C.PAST_K, C.PAST_V), "P"),
        ("cross", (C.CROSS_K, C.CROSS_V), "S"),
    ):
        for i in range(layers):
            for family, role in zip(families, ("key", "value"), strict=True):
                name = f"past_{role}_{kind}_{i}"
                inputs.append(_kv_info(name, cfg, length, kv_type))
                adapters.append(helper.make_node("Identity", [name], [f"{family}.{i}"]))
    logits_type = _float_type(graph, C.LOGITS)
    outputs = [
        helper.make_tensor_value_info(C.LOGITS, logits_type, ["batch", 1, cfg.tgt_vocab_size])
    ]
    tail = []
    for i in range(layers):
        for family, role in ((C.PRESENT_K, "key"), (C.PRESENT_V, "value")):
            name = f"present_{role}_self_{i}"
            tail.append(helper.make_node("Identity", [f"{family}.{i}"], [name]))
            outputs.append(_kv_info(name, cfg, "P_plus_1", kv_type))
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(adapters + nodes + tail)
    del graph.input[:]
    graph.input.extend(inputs)
    del graph.output[:]
    graph.output.extend(outputs)
    graph.name = "decoder"
    return graph


def _digest(tensor: onnx.TensorProto) -> str:
    array = numpy_helper.to_array(tensor)
    head = f"{array.dtype}{array.shape}".encode()
    return hashlib.sha256(head + np.ascontiguousarray(array).tobytes()).hexdigest()


def share_initializers(
    encoder: onnx.GraphProto, decoder: onnx.GraphProto
) -> list[onnx.TensorProto]:
    """Move initializers that both subgraphs hold with equal content (>= SHARED_MIN_BYTES)
    out of them; return them renamed "shared.N" for the outer graph."""
    by_digest: dict[str, onnx.TensorProto] = {}
    for tensor in encoder.initializer:
        if numpy_helper.to_array(tensor).nbytes >= SHARED_MIN_BYTES:
            by_digest.setdefault(_digest(tensor), tensor)
    shared: list[onnx.TensorProto] = []
    for tensor in list(decoder.initializer):
        if numpy_helper.to_array(tensor).nbytes < SHARED_MIN_BYTES:
            continue
        twin = by_digest.pop(_digest(tensor), None)
        if twin is None:
            continue
        name = f"shared.{len(shared)}"
        for graph, old in ((encoder, twin), (decoder, tensor)):
            _rename_uses(graph, old.name, name)
            graph.initializer.remove(old)
        moved = onnx.TensorProto()
        moved.CopyFrom(tensor)
        moved.name = name
        shared.append(moved)
    return shared


def search_model(
    encoder: onnx.ModelProto, decoder: onnx.ModelProto, cfg: ModelConfig
) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """The outer model: SEARCH_INPUTS -> one BeamSearch node -> SEARCH_OUTPUTS."""
    enc, dec = encoder_subgraph(encoder, cfg), decoder_subgraph(decoder, cfg)
    shared = share_initializers(enc, dec)
    node = helper.make_node(
        "BeamSearch",
        [*list(SEARCH_INPUTS)[:7], "", "", C.SEARCH_ATTENTION_MASK],
        list(SEARCH_OUTPUTS),
        name="beam_search",
        domain=MS_DOMAIN,
        model_type=1,
        decoder_start_token_id=cfg.start_id,
        eos_token_id=cfg.eos_id,
        pad_token_id=C.SEARCH_OUTPUT_PAD,  # no token id: a generated <pad> stays visible
        early_stopping=1,  # an input is done with num_beams finished hypotheses
        no_repeat_ngram_size=0,
        vocab_size=cfg.tgt_vocab_size,
        encoder=enc,
        decoder=dec,
    )
    inputs = [
        helper.make_tensor_value_info(name, _ONNX_TYPES[spec["dtype"]], spec["shape"])
        for name, spec in SEARCH_INPUTS.items()
    ]
    outputs = [
        helper.make_tensor_value_info(name, _ONNX_TYPES[spec["dtype"]], spec["shape"])
        for name, spec in SEARCH_OUTPUTS.items()
    ]
    graph = helper.make_graph([node], "edgeseq_search", inputs, outputs, initializer=shared)
    opsets: dict[str, int] = {}
    for model in (encoder, decoder):
        for entry in model.opset_import:
            domain = entry.domain or ""
            opsets[domain] = max(opsets.get(domain, 0), entry.version)
    opsets[MS_DOMAIN] = max(opsets.get(MS_DOMAIN, 0), 1)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
        ir_version=max(encoder.ir_version, decoder.ir_version),
        producer_name=f"edgeseq {edgeseq_version()}",
    )
    if encoder.functions or decoder.functions:
        model.functions.extend([*encoder.functions, *decoder.functions])
    return model, shared


def write_search_graph(
    encoder_path: str | Path, decoder_path: str | Path, cfg: ModelConfig, path: str | Path
) -> SearchGraphInfo:
    """Write the one-graph search model of the graph pair at `encoder_path`/`decoder_path`."""
    start = time.perf_counter()
    encoder = load_graph(encoder_path)
    model, shared = search_model(encoder, load_graph(decoder_path), cfg)
    values = {"graph": "search", "edgeseq_version": edgeseq_version()}
    values |= {"bos_id": cfg.bos_id, "eos_id": cfg.eos_id, "pad_id": cfg.pad_id}
    values |= {"max_len": cfg.max_len}
    props = {f"edgeseq.{key}": str(value) for key, value in values.items()}
    vocabulary = set(METADATA_KEYS.values())  # the fingerprints travel with the graphs
    props |= {p.key: p.value for p in encoder.metadata_props if p.key in vocabulary}
    for key, value in sorted(props.items()):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    path = Path(path)
    save_graph(model, path, check="basic")
    shared_bytes = sum(numpy_helper.to_array(t).nbytes for t in shared)
    seconds = time.perf_counter() - start
    return SearchGraphInfo(path, graph_bytes(path), seconds, len(shared), shared_bytes)
