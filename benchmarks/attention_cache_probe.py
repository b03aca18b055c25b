"""One decoder self-attention step, the way the loop runs it today against a cache kept in
place: onnxruntime's CPU `MultiHeadAttention` with the past concatenated into a new
`present` (plus the numpy gather of every hypothesis' cache that beam search does between
steps) vs `DecoderMaskedMultiHeadAttention` writing the new key/value into a preallocated
buffer bound as both past and present, with beam reordering by cache indirection.

    python benchmarks/attention_cache_probe.py --rows 128 --past 20 --heads 8 --head-size 64

Prints, per shape, whether both give the same attention output (max |difference|) and the
CPU time of each per call (median of `--repeats` timed blocks, 1 thread). The lever behind
`edgeseq export --variants ...,inplace` (docs/experiments.md: what it is worth in a whole decoder).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

FLOAT, INT32 = TensorProto.FLOAT, TensorProto.INT32


def _model(node: object, inputs: list, outputs: list) -> bytes:
    graph = helper.make_graph([node], "probe", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def concat_attention(heads: int, size: int) -> bytes:
    """MultiHeadAttention with past/present of growing length (what the bundles use)."""
    node = helper.make_node(
        "MultiHeadAttention",
        ["q", "k", "v", "", "", "", "past_k", "past_v"],
        ["out", "present_k", "present_v"],
        domain="com.microsoft",
        num_heads=heads,
    )
    qkv = [helper.make_tensor_value_info(n, FLOAT, ["B", 1, heads * size]) for n in "qkv"]
    past = [
        helper.make_tensor_value_info(n, FLOAT, ["B", heads, "P", size])
        for n in ("past_k", "past_v")
    ]
    out = [helper.make_tensor_value_info("out", FLOAT, ["B", 1, heads * size])]
    out += [
        helper.make_tensor_value_info(n, FLOAT, ["B", heads, "T", size])
        for n in ("present_k", "present_v")
    ]
    return _model(node, [*qkv, *past], out)


def in_place_attention(heads: int, size: int) -> bytes:
    """DecoderMaskedMultiHeadAttention with past_present_share_buffer and cache indirection."""
    names = ["q", "k", "v", "mask", "", "past_k", "past_v", "past_len", "beam_width", "indir"]
    node = helper.make_node(
        "DecoderMaskedMultiHeadAttention",
        names,
        ["out", "present_k", "present_v"],
        domain="com.microsoft",
        num_heads=heads,
        past_present_share_buffer=1,
    )
    inputs = [helper.make_tensor_value_info(n, FLOAT, ["B", 1, heads * size]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("mask", INT32, ["B", "T"]))
    inputs += [
        helper.make_tensor_value_info(n, FLOAT, ["B", heads, "M", size])
        for n in ("past_k", "past_v")
    ]
    inputs += [helper.make_tensor_value_info(n, INT32, [1]) for n in ("past_len", "beam_width")]
    inputs.append(helper.make_tensor_value_info("indir", INT32, ["N", "W", "M"]))
    out = [helper.make_tensor_value_info("out", FLOAT, ["B", 1, heads * size])]
    out += [
        helper.make_tensor_value_info(n, FLOAT, ["B", heads, "M", size])
        for n in ("present_k", "present_v")
    ]
    return _model(node, inputs, out)


def cpu_us(call: Callable[[], object], repeats: int, calls: int = 20) -> float:
    """Median CPU microseconds per call over `repeats` blocks of `calls` calls."""
    call()
    blocks = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            call()
        blocks.append((time.process_time() - start) / calls * 1e6)
    return float(np.median(blocks))


def probe(rows: int, past: int, heads: int, size: int, beam: int, repeats: int) -> str:
    """Both paths on one shape -> a markdown table row."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    cpu = ["CPUExecutionProvider"]
    concat = ort.InferenceSession(concat_attention(heads, size), options, providers=cpu)
    in_place = ort.InferenceSession(in_place_attention(heads, size), options, providers=cpu)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((rows, 1, heads * size), dtype=np.float32) for _ in "qkv")
    cache = [rng.standard_normal((rows, heads, past, size), dtype=np.float32) for _ in "kv"]
    inputs, longest = rows // beam, past + 8
    # indir[n, w, t]: the beam of input n whose cache holds hypothesis w's position t
    indir = rng.integers(0, beam, size=(inputs, beam, longest)).astype(np.int32)
    source = (np.arange(rows) // beam * beam)[:, None] + indir[
        np.arange(rows) // beam, np.arange(rows) % beam, :past
    ]
    gathered = [np.stack([c[source[:, t], :, t] for t in range(past)], axis=2) for c in cache]
    want = concat.run(
        ["out"], {"q": q, "k": k, "v": v, "past_k": gathered[0], "past_v": gathered[1]}
    )[0]
    buffers = []
    for c in cache:
        buffer = np.zeros((rows, heads, longest, size), np.float32)
        buffer[:, :, :past] = c
        buffers.append(ort.OrtValue.ortvalue_from_numpy(buffer))
    binding = in_place.io_binding()
    feeds = {"q": q, "k": k, "v": v, "mask": np.ones((rows, past + 1), np.int32),
             "past_len": np.array([past], np.int32), "beam_width": np.array([beam], np.int32),
             "indir": indir}  # fmt: skip
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    binding.bind_output("out")  # the first output bound: copy_outputs_to_cpu()[0]
    for name, buffer in zip(("k", "v"), buffers, strict=True):
        binding.bind_ortvalue_input(f"past_{name}", buffer)
        binding.bind_ortvalue_output(f"present_{name}", buffer)  # the same memory: in place
    in_place.run_with_iobinding(binding)
    got = binding.copy_outputs_to_cpu()[0]
    order = np.repeat(np.arange(inputs) * beam, beam)  # a reordering, as beam search does

    def concat_step() -> None:
        gathered_cache = [np.take(c, order, axis=0) for c in cache]
        concat.run(
            None, {"q": q, "k": k, "v": v, "past_k": gathered_cache[0], "past_v": gathered_cache[1]}
        )

    concat_time = cpu_us(concat_step, repeats)
    in_place_time = cpu_us(lambda: in_place.run_with_iobinding(binding), repeats)
    diff = float(np.abs(got - want).max())
    return (
        f"| {rows} | {past} | {heads} x {size} | {diff:.1e} | {concat_time:,.0f} | "
        f"{in_place_time:,.0f} | {concat_time / in_place_time:.2f}× |"
    )


def main() -> None:
    """Parse the command line, print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[4, 128], help="hypotheses (batch x beam)"
    )
    parser.add_argument("--past", type=int, nargs="+", default=[8, 32], help="cached positions")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(
        "| rows | past | heads x size | max diff | gather + concat (µs) | in place (µs) | ratio |"
    )
    print("|--:|--:|---|--:|--:|--:|--:|")
    for rows in args.rows:
        for past in args.past:
            print(probe(rows, past, args.heads, args.head_size, args.beam, args.repeats))


if __name__ == "__main__":
    main()
