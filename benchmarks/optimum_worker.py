"""Optimum's `ORTModelForSeq2SeqLM` as a worker process of `vs_optimum.py`.

    .venv-optimum/bin/python benchmarks/optimum_worker.py MARIAN_DIR ONNX_DIR --threads 1

Runs in its own virtual environment (optimum-onnx 0.1 pins transformers 4.57, edgeseq's
`hf` extra 5.x; `make bench-marian` creates it) and imports nothing of edgeseq. It exports
MARIAN_DIR to ONNX_DIR with Optimum unless ONNX_DIR already holds an export
(`ORTModelForSeq2SeqLM.from_pretrained(..., export=True)` then `save_pretrained`: encoder,
decoder and decoder-with-past graphs), loads it on the CPU provider with `--threads`
intra-op threads, prints one JSON line `{"ready": ...}` (versions, export seconds, files,
which of torch/transformers are imported) and then answers one JSON line per request line
on stdin:

    {"batches": [[marian ids, ...], ...], "beam": 4, "max_new_tokens": 64, "pad": P}
    -> {"outputs": [[ids without the decoder start and </s>], ...], "tokens": N}

`generate` runs with the options `vs_optimum.py` gives every engine (no sampling, length
penalty 1, early stopping, no forced `</s>` at the cap); tokens are each output's ids plus
one for `</s>` when it ended before the cap. An empty line ends the worker.
`generate_batches` is that call for any transformers model: `vs_optimum_engines` runs
MarianMTModel through it too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

EOS = 0  # Marian's </s>
# beam search as edgeseq's parity runs it (export/sources/generation_config.py BEAM_OPTIONS)
BEAM_OPTIONS = {"length_penalty": 1.0, "early_stopping": True}


def load(marian_dir: Path, onnx_dir: Path, threads: int) -> tuple[Any, float]:
    """The ORTModelForSeq2SeqLM of `onnx_dir` (exported from `marian_dir` when absent) and
    the export's seconds (0 when reused)."""
    import onnxruntime
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    export_s = 0.0
    if not (onnx_dir / "encoder_model.onnx").is_file():
        start = time.perf_counter()
        model = ORTModelForSeq2SeqLM.from_pretrained(marian_dir, export=True)
        model.save_pretrained(onnx_dir)
        export_s = time.perf_counter() - start
        del model
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    model = ORTModelForSeq2SeqLM.from_pretrained(
        onnx_dir, session_options=options, provider="CPUExecutionProvider"
    )
    return model, export_s


def ended_row(row: list[int], pad: int) -> tuple[tuple[int, ...], bool]:
    """A generated row (no decoder start) cut at `</s>`, pads dropped; whether it ended."""
    ended = EOS in row
    return tuple(t for t in (row[: row.index(EOS)] if ended else row) if t != pad), ended


def generate_batches(
    model: Any, batches: list[list[list[int]]], beam: int, max_new: int, pad: int
) -> tuple[list[tuple[int, ...]], int]:
    """`model.generate` (a transformers or Optimum seq2seq model) on every batch of Marian
    source ids, greedy or beam with BEAM_OPTIONS, no sampling, no `</s>` forced at the cap,
    at most `max_new` tokens -> outputs (ids without the decoder start and `</s>`) and
    tokens (ids plus one for `</s>` when it ended)."""
    import torch

    search = BEAM_OPTIONS | {"num_beams": beam} if beam > 1 else {"num_beams": 1}
    outputs, tokens = [], 0
    for batch in batches:
        width = max(map(len, batch))
        device = getattr(model, "device", "cpu")  # a CUDA model takes its inputs there
        ids = torch.tensor([row + [pad] * (width - len(row)) for row in batch], device=device)
        mask = [[1] * len(row) + [0] * (width - len(row)) for row in batch]
        mask = torch.tensor(mask, device=device)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new,
                max_length=None,
                do_sample=False,
                forced_eos_token_id=None,
                **search,
            )
        for row in out[:, 1:].tolist():
            ids, ended = ended_row(row, pad)
            outputs.append(ids)
            tokens += len(ids) + ended
    return outputs, tokens


def run(model: Any, request: dict) -> dict:
    """Generate every batch of `request` (module docstring) -> outputs and tokens."""
    outputs, tokens = generate_batches(
        model, request["batches"], request["beam"], request["max_new_tokens"], request["pad"]
    )
    return {"outputs": outputs, "tokens": tokens}


def main() -> int:
    """Load (export when absent), print the ready line, answer requests until an empty line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("marian_dir", type=Path)
    parser.add_argument("onnx_dir", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(args.threads)
    model, export_s = load(args.marian_dir, args.onnx_dir, args.threads)
    import onnxruntime
    import optimum.version
    import transformers

    files = {p.name: p.stat().st_size for p in sorted(args.onnx_dir.glob("*.onnx*"))}
    ready = {
        "export_s": export_s,
        "files": files,
        "versions": {
            "optimum": optimum.version.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__,
            "torch": torch.__version__,
        },
    }
    run(model, {"batches": [[[5, EOS]]], "beam": 1, "max_new_tokens": 2, "pad": 0})
    ready["imported"] = [m for m in ("torch", "transformers") if m in sys.modules]
    print(json.dumps({"ready": ready}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        print(json.dumps(run(model, json.loads(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
