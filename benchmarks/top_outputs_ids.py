"""Greedy and beam-4 ids and scores from the decoder graphs' top-k outputs against the same
searches reading the whole logits (numpy's float64 log-softmax), on a benchmark's sources.

    python benchmarks/top_outputs_ids.py models/g2p-en --bundle /tmp/g2p-topk --words 256
    python benchmarks/top_outputs_ids.py benchmarks/random-d512.json --bundle B --words 32

MODEL and the sources are `vs_ctranslate2.py`'s (the task's test split, else random ids);
BUNDLE is an export of MODEL with the search's outputs (`--variants fp32,int8,inplace`).
Per precision: greedy on `decoder.onnx`, beam 4 on `decoder.onnx` and on the in-place
decoder when the bundle has it, in batches of 32, every hypothesis compared
(export/kinds/seq2seq/top_parity.py's `compare`, the export's parity group `top`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vs_ctranslate2 import random_model, task_sources


def main(argv: list[str] | None = None) -> int:
    """Print one line per cell: inputs, identical, near ties, max |Δscore|."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", type=Path, help="checkpoint directory or ModelConfig JSON file")
    parser.add_argument("--bundle", type=Path, required=True, help="an export of MODEL")
    parser.add_argument("--words", type=int, default=256, help="sources (default 256)")
    args = parser.parse_args(argv)
    from edgeseq.export.kinds.seq2seq.top_parity import compare
    from edgeseq.runtime.generator import Generator

    if args.model.is_dir():
        from edgeseq.build_model.checkpoint import load_checkpoint

        model, tokenizers, meta = load_checkpoint(args.model)
        task = meta.task
    else:
        (model, tokenizers), task = random_model(args.model), None
    sources, described = task_sources(model, tokenizers, task, args.words)
    print(described)
    failed = False
    for variant in ("fp32", "int8"):
        gen = Generator.load(args.bundle, "cpu", 1, variant, search="loop")
        cells = [("greedy, decoder.onnx", gen.step_model, 1), ("beam 4", gen.step_model, 4)]
        cells += [("beam 4, in place", gen.in_place, 4)] if gen.in_place is not None else []
        for name, step, beam in cells:
            if not step.top_width:
                sys.exit(f"{args.bundle} has no top-k outputs: export it with this edgeseq")
            got = compare(step, sources, beam, None)
            failed |= not got["passed"]
            print(
                f"{variant} {name}: {got['identical']}/{got['inputs']} identical, "
                f"{got['near_ties']} near ties, max |Δscore| {got['max_score_diff']:.1e}"
            )
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
