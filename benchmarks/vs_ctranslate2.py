"""edgeseq against CTranslate2 (and PyTorch eager) on the same weights, interleaved in one run.

    pip install 'edgeseq[bench]'                     # ctranslate2, benchmark-only
    python benchmarks/vs_ctranslate2.py models/g2p-en --words 256 --passes 5 --json vs.json
    python benchmarks/vs_ctranslate2.py benchmarks/random-d512.json --words 64 --passes 3

MODEL is a checkpoint directory, or a `ModelConfig` JSON file for a random-weight model
(seed 0; its sources are random ids). The script

1. exports MODEL to an edgeseq bundle with fp32, int8, one-graph search and in-place cache
   graphs (`export_bundle`, the same export and quantization as `edgeseq export --variants
   fp32,int8,search,inplace`, without the parity run) in a temporary directory, or uses
   `--bundle` (exported from the same model);
2. converts MODEL to a CTranslate2 model (`ct2_convert.py`), loaded as float32 and int8;
3. takes `--words` distinct sources: the test split of the checkpoint's task when it can be
   loaded (g2p: CMUdict test words), else random ids; sorts them by length and cuts them
   into batches of each batch size (the same batches for every engine);
4. greedy-decodes every source with every engine at the largest batch size and compares
   the ids with edgeseq fp32's. CTranslate2 fp32 must agree on every source, except near
   ties: where it differs, both engines' teacher-forced log-probabilities of edgeseq's
   output must be within 1e-3 at every token (random weights give near-tied logits); else
   the script stops, the conversion is wrong. The others' agreement is reported;
5. times `--passes` passes per alternation pattern (`--patterns`; `harness.measure`).
   "pass": in each pass, every cell (search x batch size) runs each engine once over all
   batches, in an order rotated by one engine per pass and per cell, so a load that changes
   during the run (a shared machine) does not favour one engine. "batch": the engines take
   turns batch by batch, in a random order per batch, as a server holding several models or
   a process doing other work between calls sees them.

Engines (`vs_ctranslate2_engines.py`): "edgeseq fp32" and "edgeseq int8" are
`Generator.generate` on texts as a user calls it (search "auto", default session options,
`--threads`); the report lists the path (one-graph search, loop, or loop with the in-place
cache decoder for beam search) it took per cell. "edgeseq fp32 loop" / "int8 loop" are the
two-graph loop on decoder.onnx (`runtime.search` on `OrtStep`, which copies the cache);
`--graph` adds generate with search "graph"; `--logits-path` adds generate reading the whole
logits ("edgeseq fp32 logits": the search before the decoder graphs' top-k outputs).

Reported per cell: tokens/s of each engine relative to CTranslate2 fp32 *of the same pass*,
median over passes, with the lowest and highest per-pass ratio (the spread). Tokens are
each input's generated ids plus one for `</s>` when it ended (CTranslate2: when it stopped
before max_len). Every engine uses `--threads` intra-op threads (default 1) and one
inter-op thread; onnxruntime runs with graph optimization "all"; PyTorch eager runs the
search on `TorchStep` (with the KV cache, measured for greedy only), CTranslate2 its
`Translator.translate_batch` (beam search with length penalty 1, like edgeseq's default) at
its best setting on this CPU (`CT2_FORCE_CPU_ISA=AVX512` where the CPU has AVX-512:
`harness.ct2_best_isa`; a value already set is kept).
Prints markdown; `--json` writes every number.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import (
    PATTERNS,
    REFERENCE,
    add_cell_options,
    cell_name,
    cpu_info,
    ct2_best_isa,
    cut,
    emit_report,
    measure,
    positive_int,
    versions,
)
from vs_ctranslate2_engines import Ct2Engine, GenerateEngine, SearchEngine
from vs_ctranslate2_report import markdown

TIE_GAP = 1e-3  # log-prob gap beyond which a differing output is not a near tie
SCORER = "edgeseq fp32 loop"  # scores edgeseq's outputs teacher-forced in `agreement`


def task_sources(model: Any, tokenizers: Any, task: dict | None, n: int) -> tuple[list, str]:
    """Up to `n` distinct test-split sources of the task (ending with `</s>`, within
    max_len) and where they came from; random sources when the task cannot be loaded."""
    from edgeseq.export.parity import random_sources
    from edgeseq.runtime.errors import EdgeseqError

    if task:
        from edgeseq.build_model.tasks import load_task

        try:
            loaded = load_task(task["name"], **task.get("options", {}))
        except EdgeseqError:
            loaded = None
        if loaded is not None:
            eos, max_len = tokenizers.source.eos_id, model.cfg.max_len
            texts = dict.fromkeys(text for text, _ in loaded.split("test"))
            sources = [[*tokenizers.source.encode(t), eos] for t in texts]
            sources = [s for s in sources if len(s) <= max_len][:n]
            if sources:
                return sources, f"task {task['name']}: {len(sources)} test sources"
    return random_sources(model, n), f"{n} random sources"


def random_model(config_path: Path) -> tuple[Any, Any]:
    """A random-weight model (seed 0) of the ModelConfig in `config_path` and word-level
    tokenizers of matching vocabulary sizes."""
    import torch

    from edgeseq.build_model.model import Seq2SeqTransformer
    from edgeseq.runtime import constants as C
    from edgeseq.runtime.config import ModelConfig
    from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

    cfg = ModelConfig.load(config_path)
    specials = len(C.SPECIAL_TOKENS)
    source = Tokenizer.train_word([" ".join(f"S{i}" for i in range(cfg.src_vocab_size - specials))])
    target = Tokenizer.train_word([" ".join(f"T{i}" for i in range(cfg.tgt_vocab_size - specials))])
    torch.manual_seed(0)
    return Seq2SeqTransformer(cfg).eval(), TokenizerPair(source, target)


def agreement(engines: list, sources: list, size: int) -> dict[str, dict[str, Any]]:
    """Greedy ids of every engine vs edgeseq fp32 at batch `size`: equal sources of all.
    Where CTranslate2 fp32 differs, `tie_gap` is the largest difference between the two
    engines' teacher-forced log-probabilities of edgeseq's output (its first max_len - 1
    tokens): tiny when both compute the same model and a near tie went either way."""
    outputs = {e.name: e.run(cut(sources, size), 1)[0] for e in engines}
    by_name = {e.name: e for e in engines}
    reference = outputs["edgeseq fp32"]
    result = {}
    for name, out in outputs.items():
        same = [a == b for a, b in zip(out, reference, strict=True)]
        first = same.index(False) if not all(same) else None
        result[name] = {"equal": sum(same), "of": len(same), "first_difference": first}
    pairs = zip(outputs[REFERENCE], reference, strict=True)
    differ = [i for i, (a, b) in enumerate(pairs) if a != b]
    if differ:
        ordered = [s for batch in cut(sources, size) for s in batch]
        gaps = [0.0]
        for i in differ:
            tokens = reference[i][: by_name[REFERENCE].max_len - 1]
            ours = by_name.get(SCORER, by_name["edgeseq fp32"]).token_logprobs(ordered[i], tokens)
            theirs = by_name[REFERENCE].token_logprobs(ordered[i], tokens)
            gaps += [abs(a - b) for a, b in zip(ours, theirs, strict=True)]
        result[REFERENCE]["tie_gap"] = max(gaps)
    return result


def hide_top_outputs(generator: Any) -> None:
    """Make `generator`'s loop read the decoder's logits (numpy's float64 log-softmax), as
    before the graphs' top-k outputs (docs/bundle.md), for a before/after in one run."""
    for step in (generator.step_model, generator.in_place):
        if step is not None:
            step.top_width = 0


def patterns(text: str) -> tuple[str, ...]:
    """argparse type: some of PATTERNS, comma-separated."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names or any(n not in PATTERNS for n in names):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(PATTERNS)}, got {text!r}")
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see --help)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path, help="checkpoint directory or ModelConfig JSON file")
    bundle_help = "fp32+int8 edgeseq bundle of MODEL (default: export one to a temporary dir)"
    parser.add_argument("--bundle", type=Path, help=bundle_help)
    parser.add_argument(
        "--words", type=positive_int, default=256, help="sources to decode (default 256)"
    )
    add_cell_options(parser)
    parser.add_argument(
        "--patterns",
        type=patterns,
        default=PATTERNS,
        help="how engines alternate: pass (each decodes a whole cell in turn), batch (they "
        "take turns batch by batch, random order); comma-separated (default pass,batch)",
    )
    parser.add_argument(
        "--graph",
        action="store_true",
        help="also time generate with search 'graph' (the one-graph variant) per precision",
    )
    parser.add_argument(
        "--logits-path",
        action="store_true",
        help="also time generate reading the decoder's whole logits (the search before the "
        "graphs' top-k outputs) per precision: 'edgeseq fp32 logits'",
    )
    parser.add_argument("--json", type=Path, help="write every number (per pass) to this JSON file")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Export, convert, check agreement, measure (module docstring); return the report."""
    import torch
    from ct2_convert import convert_to_ctranslate2

    from edgeseq.build_model.checkpoint import load_checkpoint
    from edgeseq.build_model.torch_step import TorchStep
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle
    from edgeseq.export.variants import VariantOptions
    from edgeseq.runtime.bundle import load_bundle
    from edgeseq.runtime.errors import EdgeseqError
    from edgeseq.runtime.generator import Generator
    from edgeseq.runtime.kinds.seq2seq import OrtStep
    from edgeseq.runtime.providers import open_sessions

    torch.set_num_threads(args.threads)
    if args.model.is_dir():
        model, tokenizers, meta = load_checkpoint(args.model)
        task = meta.task
    elif args.model.is_file():
        (model, tokenizers), task = random_model(args.model), None
    else:
        raise EdgeseqError(f"{args.model} is neither a checkpoint directory nor a config file")
    cfg = model.cfg
    bundle_dir = args.bundle
    if bundle_dir is None:
        print("exporting the edgeseq bundle (fp32, int8, search, inplace)", file=sys.stderr)
        bundle_dir = workdir / "bundle"
        variants = VariantOptions(names=("fp32", "int8", "search", "inplace"))
        export_bundle(model, tokenizers, bundle_dir, task=task, verify=False, variants=variants)
    bundle = load_bundle(bundle_dir)
    if bundle.config != cfg or "int8" not in bundle.variants:
        raise EdgeseqError(
            f"{bundle_dir} is not an fp32+int8 export of {args.model}; "
            "export one with `edgeseq export --variants fp32,int8` or leave out --bundle"
        )
    ct2_dir = convert_to_ctranslate2(model, workdir / "ct2")
    sources, described = task_sources(model, tokenizers, task, args.words)
    eager = SearchEngine("pytorch eager", TorchStep(model), cfg.pad_id, greedy_only=True)
    engines: list = [eager]
    for variant in ("fp32", "int8"):
        # the user's path: generate with default options (search "auto")
        generator = Generator.load(bundle_dir, "cpu", args.threads, variant)
        engines.append(GenerateEngine(f"edgeseq {variant}", generator, sources))
        encoder, decoder, _ = open_sessions(*bundle.graphs(variant), "cpu", args.threads)
        step = OrtStep(encoder, decoder, cfg)
        engines.append(SearchEngine(f"edgeseq {variant} loop", step, cfg.pad_id))
        if args.logits_path:
            logits = Generator.load(bundle_dir, "cpu", args.threads, variant)
            hide_top_outputs(logits)
            engines.append(GenerateEngine(f"edgeseq {variant} logits", logits, sources))
        if args.graph and generator.graph_search is not None:
            graph = Generator.load(bundle_dir, "cpu", args.threads, variant, search="graph")
            engines.append(GenerateEngine(f"edgeseq {variant} graph", graph, sources))
    for compute_type in ("float32", "int8"):
        name = f"ctranslate2 {'fp32' if compute_type == 'float32' else compute_type}"
        engines.append(Ct2Engine(name, ct2_dir, compute_type, args.threads, cfg))
    machine = cpu_info() | {"ct2_cpu_isa": os.environ.get("CT2_FORCE_CPU_ISA", "its default")}
    with torch.inference_mode():
        agree = agreement(engines, sources, max(args.batch_sizes))
        ct2 = agree[REFERENCE]
        if ct2.get("tie_gap", 0.0) > TIE_GAP:
            raise EdgeseqError(
                f"CTranslate2 fp32 differs from edgeseq fp32 on {ct2['of'] - ct2['equal']} of "
                f"{ct2['of']} sources (first: #{ct2['first_difference']}), and scores edgeseq's "
                f"outputs {ct2['tie_gap']:.1e} per token apart: the conversion is wrong"
            )
        patterns = {
            pattern: measure(engines, sources, args.batch_sizes, args.beams, args.passes, pattern)
            for pattern in args.patterns
        }
    paths = {
        f"{engine.name}: {cell_name(*cell)}": sorted(taken)
        for engine in engines
        if isinstance(engine, GenerateEngine)
        for cell, taken in engine.paths.items()
        if cell[1] in args.batch_sizes
    }
    machine["loadavg_after"] = list(os.getloadavg())
    return {
        "model": str(args.model),
        "bundle": str(args.bundle) if args.bundle else "exported to a temporary directory",
        "sources": described,
        "threads": args.threads,
        "passes": args.passes,
        "engines": [e.name for e in engines],
        "reference": REFERENCE,
        "agreement": agree,
        "cells": patterns[args.patterns[0]],
        "patterns": patterns,
        "generate_paths": paths,
        "machine": machine,
        "versions": versions(("onnxruntime", "ctranslate2", "torch", "numpy")),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print markdown (and write --json). Returns the exit status."""
    args = parse_args(argv)
    os.environ.update(ct2_best_isa())  # before ctranslate2 loads
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print("error: ctranslate2 is not installed: pip install 'edgeseq[bench]'", file=sys.stderr)
        return 1
    from edgeseq.runtime.errors import EdgeseqError

    try:
        with tempfile.TemporaryDirectory(prefix="edgeseq-vs-ct2-") as workdir:
            report = run(args, Path(workdir))
    except EdgeseqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    emit_report(report, args.json, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
