#!/usr/bin/env bash
# The main job, run by `make demo` inside .venv, on the embedded default model:
# export models/g2p-en (English grapheme-to-phoneme) to an ONNX bundle with parity evidence
# and an int8 variant behind an accuracy gate, pronounce a few words with onnxruntime
# (no torch in that process), and compare its speed with PyTorch eager.
set -euo pipefail
MODEL=models/g2p-en
BUNDLE=bundles/g2p-en

echo "== 1/3 export $MODEL -> $BUNDLE (fp32 + int8, parity levels 1-3, accuracy gate)"
edgeseq export "$MODEL" --out "$BUNDLE" --variants fp32,int8 --force

echo
echo "== 2/3 pronounce (onnxruntime, CPU); the last four words are not in CMUdict"
edgeseq generate "$BUNDLE" --provider cpu hello phoneme transformer pronunciation \
  edgeseq onnxruntime tokenizer quokkaesque
echo "-- beam search (4 beams, 2 best) for one word"
edgeseq generate "$BUNDLE" --provider cpu --beam 4 --n-best 2 --json quokkaesque

echo
echo "== 3/3 bench: PyTorch eager vs onnxruntime fp32 / int8, 1 thread, g2p test words, 3 rounds"
# Three rounds, alternating the engines' order: one round on a shared machine can be off by 1.5x.
edgeseq bench "$BUNDLE" --checkpoint "$MODEL" --inputs 64 --repeats 3 --rounds 3 --threads 1
