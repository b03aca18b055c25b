"""Tokens/s of edgeseq and CTranslate2 generating with the same Hugging Face checkpoint of
any family (NLLB-200 / M2M-100, mBART-50, T5, Marian), each engine in a process of its own,
engines interleaved pass by pass.

    ct2-transformers-converter --model CHECKPOINT --output_dir CT2_DIR
    edgeseq export CHECKPOINT --out BUNDLE --variants fp32,int8
    python benchmarks/family_speed.py BUNDLE CT2_DIR --precisions fp32,int8 \\
        --source-lang eng_Latn --target-lang fra_Latn --threads 1,2

BUNDLE is edgeseq's export of the checkpoint, CT2_DIR CTranslate2's conversion of it, loaded
at the compute type of each precision (`--ct2-int8 DIR`: a `--quantization int8`
conversion for int8 instead). The inputs are `--inputs` made-up English sentences
(benchmarks/marian_opus.py's), tokenized by the bundle's tokenizer for both engines:
CTranslate2 gets the token strings (the source language token first and `</s>` last, the
target language as its target prefix), edgeseq the text, each with its defaults otherwise.
Both count the tokens they generate: ids plus `</s>` where an output ended before
`--max-new-tokens`, the target language not counted. CTranslate2 runs with its best ISA on
this CPU (`CT2_FORCE_CPU_ISA=AVX512` where the CPU has AVX-512: harness.ct2_best_isa).

Per thread count, the engines of every precision are started once (`--threads` intra-op
threads each, `intra_threads` for CTranslate2), warmed up on each cell's first two batches,
and take turns for `--passes` passes over every cell (harness.measure, "pass" pattern). The
table gives each engine's median tokens/s and edgeseq over CTranslate2 of the same precision,
median of the per-pass ratios (lowest-highest). Random weights decode to the length cap, so
every row runs `--max-new-tokens` steps: a measure of per-step speed, not of translations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engine_process import ProcessEngine, serve  # noqa: E402
from family_rss import PRECISIONS, language_token  # noqa: E402
from harness import (  # noqa: E402
    cpu_info,
    ct2_best_isa,
    int_list,
    machine_line,
    measure,
    pair_ratio,
    positive_int,
    say,
    versions,
)
from vs_optimum_engines import Engine  # noqa: E402


def sentences(count: int) -> list[str]:
    """`count` made-up English sentences (marian_opus.py's held-out set)."""
    from marian_opus import held_out_sentences

    return held_out_sentences(count)


class EdgeseqWorker(Engine):
    """edgeseq's Generator of one variant; batches of token ids are turned back into the
    sentences they came from."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        from edgeseq.runtime.generator import Generator

        self.spec = spec
        self.text_of = {tuple(ids): text for ids, text in spec["texts"]}
        self.generator = Generator.load(
            spec["bundle"], variant=spec["precision"], threads=spec["threads"]
        )

    def decode(self, batches, beam):
        from edgeseq.runtime.options import GenerationOptions

        spec, outputs, tokens = self.spec, [], 0
        for batch in batches:
            options = GenerationOptions(
                beam_size=beam, max_new_tokens=spec["max_new"], batch_size=len(batch),
                source_lang=spec["source_lang"], target_lang=spec["target_lang"],
            )  # fmt: skip
            texts = [self.text_of[tuple(ids)] for ids in batch]
            for result in self.generator.generate(texts, options):
                outputs.append(tuple(result.token_ids))
                tokens += len(result.token_ids) + result.finished
        return outputs, tokens


class Ct2Worker(Engine):
    """CTranslate2's Translator at one compute type, fed the bundle tokenizer's strings."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        import ctranslate2
        import tokenizers

        self.spec = spec
        tokenizer = tokenizers.Tokenizer.from_file(str(Path(spec["bundle"]) / "tokenizer.json"))
        self.token = tokenizer.id_to_token
        self.translator = ctranslate2.Translator(
            spec["path"], device="cpu", intra_threads=spec["threads"],
            compute_type=spec["compute_type"],
        )  # fmt: skip

    def decode(self, batches, beam):
        spec, outputs, tokens = self.spec, [], 0
        bundle = Path(spec["bundle"])
        source, target = (language_token(bundle, spec[k]) for k in ("source_lang", "target_lang"))
        first = [source] if source else []
        prefix = [target] if target else []
        cap = spec["max_new"]
        for batch in batches:
            sources = [first + [self.token(i) for i in ids] + ["</s>"] for ids in batch]
            results = self.translator.translate_batch(
                sources, target_prefix=[prefix] * len(batch) if prefix else None,
                beam_size=beam, max_decoding_length=cap + len(prefix),
            )  # fmt: skip
            for result in results:
                hypothesis = result.hypotheses[0][len(prefix) :]
                outputs.append(tuple(hypothesis))
                tokens += len(hypothesis) + (len(hypothesis) < cap)
        return outputs, tokens


def build(spec: dict[str, Any]) -> Engine:
    """The worker process's engine."""
    return EdgeseqWorker(spec) if spec["kind"] == "edgeseq" else Ct2Worker(spec)


def inputs(bundle: Path, count: int) -> tuple[list[list[int]], list[tuple[list[int], str]]]:
    """The sentences as the bundle tokenizer's ids (no special tokens) and (ids, text) pairs;
    sentences whose ids repeat another's are left out."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(bundle / "tokenizer.json"))
    pairs: dict[tuple[int, ...], str] = {}
    for text in sentences(count):
        pairs.setdefault(tuple(tokenizer.encode(text, add_special_tokens=False).ids), text)
    return [list(ids) for ids in pairs], [(list(ids), text) for ids, text in pairs.items()]


def engines(args: argparse.Namespace, threads: int, texts: list) -> list[ProcessEngine]:
    """Both engines of every precision, each in its own process with `threads` threads."""
    common = {"bundle": str(args.bundle), "max_new": args.max_new, "source_lang":
              args.source_lang, "target_lang": args.target_lang}  # fmt: skip
    started = []
    for precision in args.precisions:
        ours = common | {"kind": "edgeseq", "precision": precision, "texts": texts}
        ct2_dir = args.ct2_int8 if precision == "int8" and args.ct2_int8 else args.ct2
        theirs = common | {"kind": "ctranslate2", "path": str(ct2_dir),
                           "compute_type": PRECISIONS[precision]}  # fmt: skip
        for name, spec, env in ((f"edgeseq {precision}", ours, {}),
                                (f"ctranslate2 {precision}", theirs, ct2_best_isa())):  # fmt: skip
            say(f"start {name} ({threads} threads)")
            worker = [str(Path(__file__).resolve()), "--worker"]
            started.append(ProcessEngine(name, spec, threads, args.max_new, worker, env))
    return started


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every thread count's measurement; the report."""
    sources, texts = inputs(args.bundle, args.inputs)
    machine = cpu_info()
    report: dict[str, Any] = {"bundle": str(args.bundle), "ct2": str(args.ct2),
                              "inputs": len(sources), "passes": args.passes,
                              "max_new_tokens": args.max_new, "ct2_env": ct2_best_isa(),
                              "threads": {}}  # fmt: skip
    reference = f"ctranslate2 {args.precisions[0]}"
    for threads in args.threads:
        started = engines(args, threads, texts)
        try:
            cells = measure(started, sources, args.batch_sizes, args.beams, args.passes,
                            reference=reference)  # fmt: skip
        finally:
            for engine in started:
                engine.close()
        report["threads"][str(threads)] = cells
    machine["loadavg_after"] = list(os.getloadavg())
    report["machine"] = machine
    report["versions"] = versions(["onnxruntime", "ctranslate2"])
    return report


def table(report: dict[str, Any]) -> str:
    """Markdown: per thread count and cell, median tokens/s per engine and edgeseq over
    CTranslate2 of each precision."""
    lines = []
    for threads, cells in report["threads"].items():
        names = list(next(iter(cells.values())))
        lines += [f"| {threads} thread(s), tokens/s | " + " | ".join(cells) + " |",
                  "|---|" + "--:|" * len(cells)]  # fmt: skip
        for name in names:
            row = [f"{np.median(c[name]['tokens_per_s']):,.1f}" for c in cells.values()]
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        for precision in PRECISIONS:
            ours, theirs = f"edgeseq {precision}", f"ctranslate2 {precision}"
            if ours in names and theirs in names:
                row = [pair_ratio(c, ours, theirs) for c in cells.values()]
                lines.append(f"| *{ours} / {theirs}* | " + " | ".join(row) + " |")
        lines.append("")
    setting = f"{report['inputs']} inputs, {report['passes']} passes"
    lines.append(machine_line(report["machine"], report["versions"], setting))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="edgeseq's export of the checkpoint")
    parser.add_argument("ct2", type=Path, help="CTranslate2's conversion of the checkpoint")
    parser.add_argument("--ct2-int8", type=Path, help="a --quantization int8 conversion")
    parser.add_argument("--inputs", type=positive_int, default=32)
    parser.add_argument("--passes", type=positive_int, default=3)
    parser.add_argument("--beams", type=int_list, default=(1, 4))
    parser.add_argument("--batch-sizes", type=int_list, default=(1, 32))
    parser.add_argument("--threads", type=int_list, default=(1,), help="e.g. 1,2")
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32", "int8"])
    parser.add_argument("--max-new-tokens", dest="max_new", type=positive_int, default=32)
    parser.add_argument("--source-lang", help="source language code (NLLB: eng_Latn)")
    parser.add_argument("--target-lang", help="target language code (NLLB: fra_Latn)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    if argv is None and sys.argv[1:] == ["--worker"]:
        return argparse.Namespace(worker=True)
    args = parser.parse_args(argv)
    args.worker = False
    unknown = [p for p in args.precisions if p not in PRECISIONS]
    if unknown:
        parser.error(f"unknown precision {', '.join(unknown)}; choose from fp32, int8")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the table (and write --json). Returns the exit status."""
    args = parse_args(argv)
    if args.worker:  # ProcessEngine's worker: the spec and the batches come on stdin
        serve(build=build)
        return 0
    report = run(args)
    text = table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
