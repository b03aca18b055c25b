"""The decoder's log-softmax normaliser (export/top_outputs.py) with its sum in float32 and in
float64: error against numpy's float64 log(sum(exp(logit - max))) and milliseconds per call,
one intra-op thread, the two graphs interleaved.

    python benchmarks/normaliser_sum.py --vocab 58101 --rows 128    # opus-mt, beam 4 x 32
    python benchmarks/normaliser_sum.py --vocab 256206 --rows 16    # NLLB-200

The logits are standard normals scaled per row by 0.1, 2, 5 or 20 (flat to peaked
distributions). export/top_outputs.py's FLOAT64_SUM_ROWS picks float64 above 65,536 rows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def build(vocab: int, float64: bool, path: Path) -> None:
    """A graph `x` float32 (rows, vocab) -> `y` float32 (rows,): log of the sum of
    exp(x - max), the sum in float64 when asked (export/top_outputs.py's nodes)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgeseq.export.top_outputs import normaliser_nodes

    graph = helper.make_graph(
        normaliser_nodes("x", "axis", "y", float64), "normaliser",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", vocab])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows"])],
        [numpy_helper.from_array(np.array([-1], np.int64), "axis")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.save(model, path)


def main(argv: list[str] | None = None) -> int:
    """Print, per precision of the sum: max |error| over the rows and the fastest call."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=58101, help="vocabulary rows (58101)")
    parser.add_argument("--rows", type=int, default=128, help="rows per call (128)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls each (20)")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    scales = rng.choice([0.1, 2.0, 5.0, 20.0], size=(args.rows, 1))
    x = (rng.standard_normal((args.rows, args.vocab)) * scales).astype(np.float32)
    wide = x.astype(np.float64)
    want = np.log(np.exp(wide - wide.max(axis=1, keepdims=True)).sum(axis=1))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, float64 in (("float32", False), ("float64", True)):
            path = Path(tmp) / f"{name}.onnx"
            build(args.vocab, float64, path)
            sessions[name] = ort.InferenceSession(str(path), options, ["CPUExecutionProvider"])
    times: dict[str, list[float]] = {name: [] for name in sessions}
    errors = {}
    for name, session in sessions.items():
        errors[name] = float(np.abs(session.run(["y"], {"x": x})[0] - want).max())
    for _ in range(args.repeats):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(["y"], {"x": x})
            times[name].append(time.perf_counter() - start)
    print(f"vocab {args.vocab}, {args.rows} rows, fastest of {args.repeats} calls")
    for name in sessions:
        print(f"sum in {name}: max |error| {errors[name]:.1e}, {min(times[name]) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
