"""edgeseq against what users run a MarianMT model with today, on the same checkpoint.

    make bench-marian                    # creates .venv-optimum, then runs this
    python benchmarks/vs_optimum.py runs/vs-optimum --inputs 64 --passes 3 --json vs.json
    python benchmarks/vs_optimum.py /tmp/vs-tiny --tiny --inputs 6 --passes 1   # ~1-2 min

WORK is a directory that keeps what the run builds, each step skipped when its result is
already there:

- WORK/marian: the MarianMT checkpoint (`--model DIR` uses yours instead); built when absent:
  opus-mt-sized (d_model 512, 6 + 6 layers, 8 heads, FFN 2048, a 32k SentencePiece
  vocabulary, random weights whose `</s>` logit grows with the position so that outputs end
  at varied lengths: `marian_opus.py`), or with `--tiny` a d_model 32, 2 + 2 layer one;
- WORK/bundle: `edgeseq export WORK/marian --variants fp32,int8,inplace --data
  WORK/heldout.txt` (docs/variants.md's export for a CPU server, less `steps`, which only
  `edgeseq serve` runs; `--variants` changes it), with its parity checks against
  MarianMTModel (`--tiny`: `--no-verify`);
- WORK/ct2: `ctranslate2.converters.TransformersConverter` (what `ct2-transformers-converter`
  runs), loaded as float32 and int8;
- WORK/optimum: Optimum's ONNX export, run by `optimum_worker.py` in the separate virtual
  environment `--optimum-python` (default .venv-optimum/bin/python; optimum-onnx
  0.1 pins transformers 4.57). Without it the Optimum rows are skipped and the report says why.

The engines, one intra-op thread each (`--threads`), each in a process of its own
(`engine_process.py`; `--one-process`: all but Optimum in this one), every one starting from
Marian's ids: transformers `MarianMTModel.generate` (PyTorch eager), Optimum
`ORTModelForSeq2SeqLM.generate`, CTranslate2 `Translator.translate_batch` (fp32, int8; at its
best setting: `CT2_FORCE_CPU_ISA=AVX512` where the CPU has AVX-512, `harness.ct2_best_isa`)
and edgeseq `Generator.generate` (`Generator.load(bundle, threads=..., variant=...)`,
default options: it tokenizes the text itself, which is inside its time). The search is the
same everywhere: greedy or beam 4, no sampling, length penalty 1, an input stops at
beam_size finished hypotheses (transformers' `early_stopping=True`, edgeseq's default), no
`</s>` forced at the cap, at most `--max-new-tokens`. Inputs: `--inputs` held-out sentences
of the synthetic language, sorted by length and cut into batches (`harness.cut`), the same
for every engine.

Timing is `harness.measure`, as in `vs_ctranslate2.py`: in each pass every cell (search x
batch size) runs each engine once over all inputs, in an order rotated per pass and cell; a
ratio is tokens/s over CTranslate2 fp32's of the same pass, median over passes. Tokens are
each output's ids plus one for `</s>` when it ended before the cap. Every output of every
pass is compared with transformers' of the same cell: the report counts identical inputs per
engine and cell.
The memory-bandwidth bound: bytes of the weights a batch-1 decoder step reads
(`marian_opus.decoder_step_parameters`) over a numpy copy's bytes/s on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engine_process import ProcessEngine  # noqa: E402
from harness import (  # noqa: E402
    REFERENCE,
    add_cell_options,
    cell_name,
    cpu_info,
    ct2_best_isa,
    emit_report,
    measure,
    positive_int,
    say,
    versions,
)
from vs_optimum_engines import (  # noqa: E402
    SOURCE,
    Ct2Engine,
    EdgeseqEngine,
    Engine,
    OptimumEngine,
    TransformersEngine,
)

DEFAULT_OPTIMUM_PYTHON = HERE.parent / ".venv-optimum" / "bin" / "python"
GRAPH_KEYS = ("search", "steps", "inplace")  # manifest keys of the variants beside precisions


# -- building what the engines run ------------------------------------------------------------
def prepare_model(args: argparse.Namespace) -> Path:
    """The Marian checkpoint: --model, else WORK/marian (built when absent)."""
    from marian_opus import OPUS_SIZE, TINY_SIZE, build_marian

    if args.model is not None:
        return args.model
    path = args.work / "marian"
    if not (path / "model.safetensors").is_file():
        say(f"building the {'tiny' if args.tiny else 'opus-mt-sized'} Marian checkpoint at {path}")
        size = TINY_SIZE if args.tiny else OPUS_SIZE
        build_marian(path, size)
    return path


def prepare_bundle(args: argparse.Namespace, marian: Path, heldout: Path) -> tuple[Path, float]:
    """WORK/bundle via `edgeseq export` (skipped when one with every asked variant is there;
    replaced when it lacks one) and its seconds (0: reused)."""
    bundle = args.work / "bundle"
    asked = set(args.variants.split(","))
    if (bundle / "manifest.json").is_file():
        manifest = json.loads((bundle / "manifest.json").read_text())
        present = set(manifest["variants"]) | {k for k in GRAPH_KEYS if k in manifest}
        if asked <= present:
            return bundle, 0.0
        say(f"{bundle} lacks {', '.join(sorted(asked - present))}: exporting it again")
    edgeseq = Path(sys.executable).with_name("edgeseq")
    command = [str(edgeseq), "export", str(marian), "--out", str(bundle), "--data", str(heldout)]
    command += ["--force"] if bundle.exists() else []
    command += ["--variants", args.variants, "--inputs", str(args.export_inputs)]
    command += ["--max-metric-drop", str(args.max_metric_drop)]
    if args.tiny or args.no_verify:
        command.append("--no-verify")
    say(" ".join(command))
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    say(done.stdout)  # its progress, parity table and variants table
    if done.returncode != 0:
        raise RuntimeError(f"edgeseq export failed (exit {done.returncode}): {command}")
    return bundle, time.perf_counter() - start


def prepare_ct2(args: argparse.Namespace, marian: Path) -> Path:
    """WORK/ct2: the checkpoint converted by CTranslate2's Transformers converter."""
    from ctranslate2.converters import TransformersConverter

    path = args.work / "ct2"
    if not (path / "model.bin").is_file():
        say(f"converting to CTranslate2 at {path}")
        TransformersConverter(str(marian)).convert(str(path), force=True)
    return path


def source_ids(marian: Path, texts: list[str], bundle: Path) -> tuple[list, dict, int]:
    """Marian ids of `texts` (MarianTokenizer), the text of each, and how many texts edgeseq's
    tokenizer encodes differently (those are left out)."""
    import warnings

    from transformers import MarianTokenizer

    from edgeseq.runtime.bundle import load_bundle

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = MarianTokenizer.from_pretrained(marian)
    ours = load_bundle(bundle).tokenizers.source
    sources, text_of, differ = [], {}, 0
    for text in texts:
        ids = tokenizer(text).input_ids  # ends with </s>
        if [i + 2 for i in ids[:-1]] != ours.encode(text):
            differ += 1
            continue
        sources.append(ids)
        text_of[tuple(ids)] = text
    return sources, text_of, differ


# -- reporting --------------------------------------------------------------------------------
def identical(engines: list[Engine], source_name: str = SOURCE) -> dict[str, dict[str, list[int]]]:
    """Per cell, per engine: [inputs whose ids equal those of the engine named `source_name`
    (transformers'), inputs] (last pass)."""
    source = next(e for e in engines if e.name == source_name)
    result: dict[str, dict[str, list[int]]] = {}
    for (beam, size), reference in source.outputs.items():
        cell = result.setdefault(cell_name(beam, size), {})
        for engine in engines:
            ours = engine.outputs.get((beam, size))
            if ours is not None and engine is not source:
                cell[engine.name] = [
                    sum(a == b for a, b in zip(ours, reference, strict=True)),
                    len(reference),
                ]
    return result


def bandwidth_bound(marian: Path, bundle: Path, cells: dict, bytes_per_s: float) -> dict:
    """The batch-1 greedy bound and each engine's fraction of it (module docstring)."""
    config = json.loads((marian / "config.json").read_text())
    manifest = json.loads((bundle / "manifest.json").read_text())
    kept = manifest["variants"]["int8"]["quantization"]["kept_fp32"]
    return bandwidth_bound_numbers(config, cells, bytes_per_s, "output projection" in kept)


def bandwidth_bound_numbers(
    config: dict, cells: dict, bytes_per_s: float, fp32_output: bool = True
) -> dict[str, Any]:
    """`bandwidth_bound` of a config.json's dict; `fp32_output`: edgeseq's int8 graphs keep
    the output projection in fp32 (the default export; CTranslate2 int8 quantizes it)."""
    from marian_opus import decoder_step_parameters

    parts = decoder_step_parameters(config)
    fp32_bytes = 4 * sum(parts.values())
    output_bytes = (4 if fp32_output else 1) * parts["output projection"]
    step_bytes = {
        "edgeseq int8": parts["decoder layers"] + output_bytes,
        "ctranslate2 int8": sum(parts.values()),
    }
    greedy = cells.get("greedy, batch 1", {})
    engines = {}
    for name, numbers in greedy.items():
        rate = float(np.median(numbers["tokens_per_s"]))
        own = step_bytes.get(name, fp32_bytes)
        engines[name] = {
            "tokens_per_s": rate,
            "step_bytes": own,
            "fraction_of_fp32_bound": rate / (bytes_per_s / fp32_bytes),
            "fraction_of_own_bound": rate / (bytes_per_s / own),
        }
    return {
        "parameters": parts,
        "fp32_step_bytes": fp32_bytes,
        "copy_bytes_per_s": bytes_per_s,
        "fp32_bound_tokens_per_s": bytes_per_s / fp32_bytes,
        "engines": engines,
    }


# -- the command line -------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see --help)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("work", type=Path, help="directory keeping the checkpoint and exports")
    parser.add_argument("--model", type=Path, help="a MarianMT save_pretrained directory to use")
    parser.add_argument("--tiny", action="store_true", help="a tiny checkpoint (seconds)")
    parser.add_argument("--inputs", type=positive_int, default=64, help="sources (default 64)")
    add_cell_options(parser)
    parser.add_argument("--max-new-tokens", type=positive_int, default=96, help="(default 96)")
    parser.add_argument(
        "--variants",
        default="fp32,int8,inplace",
        help="edgeseq export --variants (default fp32,int8,inplace; needs fp32 and int8)",
    )
    parser.add_argument(
        "--export-inputs",
        type=positive_int,
        default=64,
        help="edgeseq export --inputs (default 64)",
    )
    parser.add_argument(
        "--max-metric-drop",
        type=float,
        default=100.0,
        help="edgeseq export's int8 gate (default 100: random model)",
    )
    parser.add_argument(
        "--optimum-python",
        type=Path,
        default=DEFAULT_OPTIMUM_PYTHON,
        help="Optimum's venv python (default .venv-optimum)",
    )
    parser.add_argument(
        "--no-verify", action="store_true", help="export without parity checks (--tiny: always)"
    )
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="run transformers, CTranslate2 and edgeseq in this process (default: each in a "
        "process of its own, so that their thread pools never share the cores)",
    )
    parser.add_argument("--json", type=Path, help="write every number to this JSON file")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build, export, convert, measure (module docstring); return the report."""
    import torch
    from marian_opus import copy_bandwidth, held_out_sentences

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    marian = prepare_model(args)
    texts = held_out_sentences(args.inputs)
    heldout = args.work / "heldout.txt"
    heldout.write_text("\n".join(held_out_sentences(args.export_inputs)) + "\n", encoding="utf-8")
    bundle, export_s = prepare_bundle(args, marian, heldout)
    ct2_dir = prepare_ct2(args, marian)
    sources, text_of, differ = source_ids(marian, texts, bundle)
    vocab = json.loads((marian / "vocab.json").read_text(encoding="utf-8"))
    pad, cap = vocab["<pad>"], args.max_new_tokens
    texts = [[list(ids), text] for ids, text in text_of.items()]
    specs = {
        SOURCE: {"kind": "transformers", "marian": str(marian), "pad": pad},
        **{
            f"ctranslate2 {label}": {"kind": "ctranslate2", "path": str(ct2_dir),
                                     "compute_type": compute, "vocab": str(marian / "vocab.json")}
            for compute, label in (("float32", "fp32"), ("int8", "int8"))
        },
        **{
            f"edgeseq {variant}": {"kind": "edgeseq", "variant": variant, "bundle": str(bundle),
                                   "texts": texts}
            for variant in ("fp32", "int8")
        },
    }  # fmt: skip
    if args.one_process:
        engines: list[Engine] = [TransformersEngine(marian, pad, cap)]
    else:
        engines = [ProcessEngine(SOURCE, specs[SOURCE], args.threads, cap)]
    skipped = {}
    if args.optimum_python.is_file():
        say("starting the Optimum worker (exports WORK/optimum when absent)")
        engines.append(
            OptimumEngine(
                args.optimum_python, marian, args.work / "optimum", args.threads, pad, cap
            )
        )
    else:
        skipped["optimum"] = f"{args.optimum_python} not found (make bench-marian creates it)"
        say(f"skipping Optimum: {skipped['optimum']}")
    for name, spec in list(specs.items())[1:]:
        if not args.one_process:
            engines.append(ProcessEngine(name, spec, args.threads, cap))
        elif spec["kind"] == "ctranslate2":
            engines.append(Ct2Engine(name, ct2_dir, spec["compute_type"], args.threads, vocab, cap))
        else:
            engines.append(EdgeseqEngine(spec["variant"], bundle, args.threads, text_of, cap))
    machine = cpu_info() | {"ct2_cpu_isa": os.environ.get("CT2_FORCE_CPU_ISA", "its default")}
    bytes_per_s = copy_bandwidth(64 if args.tiny else 512)
    cells = measure(engines, sources, args.batch_sizes, args.beams, args.passes)
    machine["loadavg_after"] = list(os.getloadavg())
    optimum = next((e for e in engines if isinstance(e, OptimumEngine)), None)
    for engine in engines:
        if isinstance(engine, (OptimumEngine, ProcessEngine)):
            engine.close()
    manifest = json.loads((bundle / "manifest.json").read_text())
    first_cell = (min(args.beams), max(args.batch_sizes))  # greedy, unless no greedy cell ran
    lengths = [len(o) for o in engines[0].outputs[first_cell]]
    return {
        "model": str(marian),
        "config": {
            k: json.loads((marian / "config.json").read_text())[k]
            for k in (
                "d_model",
                "encoder_layers",
                "decoder_layers",
                "encoder_attention_heads",
                "encoder_ffn_dim",
                "vocab_size",
            )
        },
        "sources": f"{len(sources)} held-out sentences ({differ} left out: tokenized differently)",
        "greedy_output_lengths": {
            "min": min(lengths),
            "median": float(np.median(lengths)),
            "max": max(lengths),
            "at_cap": sum(n >= cap for n in lengths),
        },
        "max_new_tokens": cap,
        "threads": args.threads,
        "passes": args.passes,
        "engines": [e.name for e in engines],
        "skipped": skipped,
        "reference": REFERENCE,
        "cells": cells,
        "identical_to_transformers": identical(engines),
        "bound": bandwidth_bound(marian, bundle, cells, bytes_per_s),
        "edgeseq_parity": manifest.get("parity", {}),
        "export_seconds": {
            "edgeseq": export_s,
            **({"optimum": optimum.ready["export_s"]} if optimum else {}),
        },
        "files_mb": files_mb(marian, bundle, ct2_dir, optimum),
        "optimum_ready": optimum.ready if optimum else None,
        "machine": machine,
        "versions": versions(("onnxruntime", "ctranslate2", "torch", "transformers", "numpy")),
    }


def files_mb(marian: Path, bundle: Path, ct2_dir: Path, optimum: OptimumEngine | None) -> dict:
    """Megabytes each engine loads."""
    mb = {
        "transformers eager": (marian / "model.safetensors").stat().st_size / 1e6,
        "ctranslate2 (float32 file)": (ct2_dir / "model.bin").stat().st_size / 1e6,
    }
    manifest = json.loads((bundle / "manifest.json").read_text())
    for name, entry in manifest.get("variants", {}).items():
        mb[f"edgeseq {name}"] = entry["bytes"] / 1e6  # its encoder and decoder graphs
    if optimum is not None:
        mb["optimum"] = sum(optimum.ready["files"].values()) / 1e6
    return mb


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print markdown (and write --json). Returns the exit status."""
    args = parse_args(argv)
    os.environ.update(ct2_best_isa())  # before ctranslate2 loads, here and in the workers
    try:
        import ctranslate2  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc.name} is not installed: pip install '.[bench,hf]'", file=sys.stderr)
        return 1
    from vs_optimum_report import markdown

    report = run(args)
    emit_report(report, args.json, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
