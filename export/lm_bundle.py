"""Write a GPT or BERT bundle: `model.onnx` (+ `model.int8.onnx`), config.json, tokenizers,
GPT's `genai_config.json`, manifest.json with parity, like export/bundle.py for the
encoder–decoder (same atomic write, manifest structure, checksums and parity report).

    held = heldout_sources(meta.task, tokenizers, model)               # export/heldout.py
    manifest = export_lm_bundle(model, tokenizers, "bundles/words", task=meta.task, held=held)

Parity (export/lm_parity.py) runs on the held-out inputs: GPT prompts are the task's sources
without `</s>`. The int8 variant is gated like the encoder–decoder's: greedy outputs (GPT)
or predicted labels (BERT) on the same inputs, the task metric (exact match) against the
references, at most `max_metric_drop` points below fp32; a miss raises `GateError` (no
layer-exclusion search for these kinds).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgeseq.build_model.lm import DecoderOnlyTransformer, EncoderOnlyTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.atomic import atomic_directory
from edgeseq.runtime.errors import BundleError, OptionsError
from edgeseq.runtime.manifest import write_manifest
from edgeseq.runtime.providers import session_options
from edgeseq.runtime.tokenizer import TokenizerPair

from .bundle import exporter_versions, min_onnxruntime, portable_task, refuse_existing
from .heldout import HeldOut
from .lm_export import export_bert, export_gpt, write_genai_config
from .lm_parity import (
    Run,
    bert_feeds,
    greedy_loop,
    predictions,
    run_lm_parity,
    session_run,
)
from .onnx_export import GraphInfo, edgeseq_version
from .quantize import quantize_graph
from .variants import GateError, VariantOptions
from .verify import check_parity

INT8_FILE = "model.int8.onnx"
GRAPH_FILES = {"fp32": C.MODEL_FILE, "int8": INT8_FILE}
KINDS = {C.DECODER_ONLY: "gpt", C.ENCODER_ONLY: "bert"}
Progress = Callable[[str], None]
LMModel = DecoderOnlyTransformer | EncoderOnlyTransformer


def lm_inputs(model: LMModel, held: HeldOut) -> list[list[int]]:
    """The held-out inputs as the graph takes them: GPT prompts lose their `</s>`."""
    if isinstance(model, EncoderOnlyTransformer):
        return held.sources
    return [s[:-1] if s and s[-1] == model.cfg.eos_id else s for s in held.sources]


def open_run(path: Path) -> Run:
    """A one-thread CPU session of a graph file, as a `Run`."""
    import onnxruntime as ort

    options = session_options(threads=1)
    return session_run(ort.InferenceSession(str(path), options, ["CPUExecutionProvider"]))


def outputs(
    model: LMModel, run: Run, inputs: list[list[int]], tokenizers: TokenizerPair
) -> list[str]:
    """Greedy prompt + continuation texts (GPT) or predicted label names (BERT)."""
    cfg = model.cfg
    if isinstance(model, EncoderOnlyTransformer):
        labels = np.concatenate(
            [
                predictions(run(bert_feeds(cfg, inputs[i : i + 64]))[1])
                for i in range(0, len(inputs), 64)
            ]
        )
        return [tokenizers.target.decode([int(i)]) for i in labels]
    texts = []
    for i in range(0, len(inputs), 64):
        chunk = inputs[i : i + 64]
        found, _, _ = greedy_loop(run, cfg, chunk, cfg.max_len)
        texts += [tokenizers.target.decode([*p, *f]) for p, f in zip(chunk, found, strict=True)]
    return texts


def gate(fp32: list[str], other: list[str], held: HeldOut, max_drop: float) -> dict[str, Any]:
    """Agreement with fp32 and exact match vs the references (agreement without them)."""
    agreement = float(np.mean([a == b for a, b in zip(fp32, other, strict=True)]))
    if held.references is None:
        ref_score, score = 1.0, agreement
        metric = "agreement"
    else:
        refs = held.references
        ref_score = float(np.mean([t in r for t, r in zip(fp32, refs, strict=True)]))
        score = float(np.mean([t in r for t, r in zip(other, refs, strict=True)]))
        metric = "exact_match"
    drop = 100.0 * (ref_score - score)
    return {
        "metric": metric,
        "fp32": round(ref_score, 6),
        "variant": round(score, 6),
        "agreement": round(agreement, 6),
        "drop_points": round(drop, 4),
        "max_drop_points": max_drop,
        "inputs": len(fp32),
        "source": held.description,
        "passed": drop <= max_drop,
    }


def build_lm_variants(
    directory: Path,
    model: LMModel,
    tokenizers: TokenizerPair,
    held: HeldOut | None,
    options: VariantOptions,
    say: Progress,
) -> dict[str, dict[str, Any]]:
    """The manifest's `variants` table: fp32, and int8 behind its gate when asked."""
    unknown = [n for n in options.names if n not in GRAPH_FILES]
    if unknown:
        raise OptionsError(
            f"variants {', '.join(unknown)} are not built for {KINDS[model.cfg.architecture]} "
            f"bundles; choose from {', '.join(GRAPH_FILES)}"
        )
    table: dict[str, dict[str, Any]] = {"fp32": {"verified": held is not None, "gate": None}}
    reference = None
    if held is not None:
        inputs = lm_inputs(model, held)
        reference = outputs(model, open_run(directory / C.MODEL_FILE), inputs, tokenizers)
    if "int8" in options.names:
        say("variant int8")
        nodes = quantize_graph(
            directory / C.MODEL_FILE,
            directory / INT8_FILE,
            quantize_all=options.quantize_all,
            per_channel=options.per_channel,
            reduce_range=options.reduce_range,
        )
        entry: dict[str, Any] = {
            "quantization": {
                "method": "onnxruntime quantize_dynamic: int8 weights, uint8 activations",
                "per_channel": options.per_channel,
                "reduce_range": options.reduce_range,
                "quantize_all": options.quantize_all,
                "quantized_nodes": len(nodes["quantized"]),
                "fp32_nodes": nodes["kept"],
            },
            "gate": None,
            "verified": False,
        }
        if reference is not None:
            got = outputs(model, open_run(directory / INT8_FILE), inputs, tokenizers)
            entry["gate"] = gate(reference, got, held, options.max_metric_drop)
            entry["verified"] = entry["gate"]["passed"]
            g = entry["gate"]
            say(
                f"  int8 gate: {g['metric']} {g['fp32']:.4f} -> {g['variant']:.4f}, agreement "
                f"{g['agreement']:.1%}: {'ok' if g['passed'] else 'FAIL'}"
            )
            if not entry["gate"]["passed"]:
                raise GateError(
                    f"int8 misses the accuracy gate: {entry['gate']['metric']} drops "
                    f"{entry['gate']['drop_points']:.2f} points (at most "
                    f"{options.max_metric_drop}); export without int8 or raise --max-metric-drop",
                    "int8",
                    [entry["gate"] | {"excluded_groups": []}],  # no layer kept in fp32
                )
        table["int8"] = entry
    fp32_bytes = (directory / C.MODEL_FILE).stat().st_size
    for name, entry in table.items():
        size = (directory / GRAPH_FILES[name]).stat().st_size
        entry.update(model=GRAPH_FILES[name], precision=name, format="onnx", bytes=size)
        entry["size_ratio"] = round(size / fp32_bytes, 4)
        entry.setdefault("speed", None)
    return table


def lm_config(
    model: LMModel, tokenizer_files: list[str], graph: GraphInfo, task: dict[str, Any] | None
) -> dict[str, Any]:
    """config.json of a GPT or BERT bundle (the encoder–decoder's with one graph's io)."""
    cfg = model.cfg
    ids = {"pad": cfg.pad_id, "bos": cfg.bos_id, "eos": cfg.eos_id, "unk": cfg.unk_id}
    tokens = dict(zip(ids, C.SPECIAL_TOKENS, strict=True))
    return {
        "model": cfg.to_dict(),
        "kind": KINDS[cfg.architecture],
        "special_tokens": {role: {"id": i, "token": tokens[role]} for role, i in ids.items()},
        "io": {"model": {"inputs": graph.inputs, "outputs": graph.outputs}},
        "tokenizers": {"source": tokenizer_files[0], "target": tokenizer_files[-1]},
        "task": portable_task(task),
    }


def export_lm_bundle(
    model: LMModel,
    tokenizers: TokenizerPair,
    out: str | Path,
    *,
    task: dict[str, Any] | None = None,
    held: HeldOut | None = None,
    opset: int | None = None,
    force: bool = False,
    verify: bool = True,
    variants: VariantOptions | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Export a GPT or BERT `model` to a bundle directory `out`; return its manifest. With
    `verify`, `held` (export/heldout.py) is required: parity failures raise `ParityError`,
    a missed int8 gate `GateError`, and nothing is written."""
    say = progress or (lambda _: None)
    out, options = Path(out), variants or VariantOptions()
    refuse_existing(out, force)
    if verify and held is None:
        raise OptionsError("verifying a GPT or BERT export needs held-out inputs")
    model.eval()
    start = time.perf_counter()
    kind = KINDS[model.cfg.architecture]
    with atomic_directory(out) as tmp:
        say(f"export {kind} graph")
        exporter = export_gpt if kind == "gpt" else export_bert
        graph = exporter(model, tmp / C.MODEL_FILE, opset)
        say(f"  {C.MODEL_FILE}: {graph.bytes / 1e6:.2f} MB in {graph.seconds:.1f} s")
        parity: dict[str, Any] = {"skipped": True}
        if verify:
            say(f"parity levels 1-3 on {len(held.sources)} inputs ({held.description})")
            parity = run_lm_parity(
                model,
                open_run(tmp / C.MODEL_FILE),
                lm_inputs(model, held),
                source_description=held.description,
                texts=held.texts,
            )
            check_parity(parity)
        table = build_lm_variants(tmp, model, tokenizers, held if verify else None, options, say)
        say("write config, tokenizers, manifest")
        if kind == "gpt":
            write_genai_config(model.cfg, tmp)
        files = tokenizers.save(tmp, model.cfg.max_len)
        text = json.dumps(lm_config(model, files, graph, task), indent=2, sort_keys=True)
        (tmp / C.CONFIG_FILE).write_text(text + "\n", encoding="utf-8")
        manifest = {
            "edgeseq_version": edgeseq_version(),
            "kind": kind,
            "architecture": model.cfg.architecture,
            "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "min_onnxruntime": min_onnxruntime(graph.opset, graph.ir_version),
            "opset": graph.opset,
            "ir_version": graph.ir_version,
            "exporter": exporter_versions(),
            "graphs": {"model": {"bytes": graph.bytes, "export_seconds": round(graph.seconds, 2)}},
            "export_seconds": round(time.perf_counter() - start, 2),
            "variants": table,
            "parity": parity,
        }
        manifest = write_manifest(tmp, manifest)
    say(f"wrote {out}")
    return manifest


def verify_lm_bundle(
    bundle: Path,
    manifest: dict[str, Any],
    model: LMModel,
    held: HeldOut,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Parity levels 1-3 of a GPT or BERT bundle's fp32 graph (checksums already checked)
    against `model`; ParityError when a level fails, BundleError for another model's bundle."""
    say = progress or (lambda _: None)
    config = json.loads((bundle / C.CONFIG_FILE).read_text(encoding="utf-8"))
    if config.get("model") != model.cfg.to_dict():
        raise BundleError(
            f"{bundle} was exported from a model with another config than the checkpoint; "
            "pass the checkpoint it was exported from"
        )
    say(f"parity levels 1-3 on {len(held.sources)} inputs ({held.description})")
    graph = bundle / manifest["variants"]["fp32"]["model"]
    report = run_lm_parity(
        model,
        open_run(graph),
        lm_inputs(model, held),
        source_description=held.description,
        texts=held.texts,
    )
    check_parity(report)
    return report
