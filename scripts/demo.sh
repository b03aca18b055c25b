#!/usr/bin/env bash
# The main job, run by `make demo` inside .venv: train a small model on a built-in task,
# export it to an ONNX bundle with parity evidence, and generate with onnxruntime.
set -euo pipefail
RUN=runs/demo-reverse
BUNDLE=bundles/demo-reverse

echo "== 1/3 train: reverse strings (tiny recipe, a few minutes on 2 cores)"
if [ -d "$RUN/best" ]; then
  echo "reusing $RUN (delete it to retrain)"
else
  edgeseq train --task reverse --recipe models/recipes/tiny.json --out "$RUN" --seed 0
fi

echo "== 2/3 export: encoder + decoder-step ONNX graphs, parity levels 1-3"
edgeseq export "$RUN/best" --out "$BUNDLE" --force

echo "== 3/3 generate with onnxruntime (no torch in the loop)"
edgeseq generate "$BUNDLE" "abcdef" "hello" "edgeseq"
edgeseq generate "$BUNDLE" --beam 4 "reverse"
