"""What the one-graph kinds (decoder-only GPT, encoder-only BERT) share in export: running a
graph or the PyTorch model on the graph's feeds, parity in the report format of
export/verify.py, the int8 variant behind its gate, and writing the bundle (`model.onnx`,
`model.int8.onnx`, config.json, tokenizers, manifest.json with parity) with the same atomic
write, manifest structure and checksums as the encoder–decoder's (export/bundle.py).

    manifest = export_one_graph(model, tokenizers, "bundles/words", task=task, held=held)
    report = run_one_graph_parity(model, session_run(session), prompts)

What differs between the kinds (the graph, its parity levels, what a held-out input becomes,
what the gate compares, GPT's genai_config.json) is each kind's module: `kind(model)` finds
it through the registry (export/kinds/__init__.py). Parity runs on the held-out inputs; the
int8 variant is gated like the encoder–decoder's: greedy outputs (GPT) or predicted labels
(BERT) on the same inputs, the task metric (exact match) against the references, at most
`max_metric_drop` points below fp32; a miss raises `GateError` (no layer-exclusion search).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import Tensor

from edgeseq.runtime import constants as C
from edgeseq.runtime.atomic import atomic_directory
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.manifest import write_manifest
from edgeseq.runtime.providers import session_options
from edgeseq.runtime.tokenizer import TokenizerPair
from edgeseq.runtime.vocabulary import MANIFEST_KEY, fingerprints, graph_metadata

from ..bundle import (
    bundle_config,
    bundle_manifest,
    min_onnxruntime,
    refuse_existing,
    write_json,
)
from ..heldout import HeldOut
from ..onnx_export import GraphInfo, _value_info
from ..quantize import quantize_graph
from ..variants import GateError, VariantOptions
from ..verify import check_parity, parity_report, single_thread
from . import kind_module

Run = Callable[[dict[str, np.ndarray]], list[np.ndarray]]  # graph feeds -> graph outputs
LEVEL2_ROWS = 8
MAX_REPORTED_MISMATCHES = 5
EXAMPLE_BATCH, EXAMPLE_NEW = 2, 4  # export examples: >= 2 on every dynamic axis
INT8_FILE = "model.int8.onnx"
GRAPH_FILES = {"fp32": C.MODEL_FILE, "int8": INT8_FILE}
Progress = Callable[[str], None]
OneGraphModel = Any  # DecoderOnlyTransformer | EncoderOnlyTransformer


def kind(model: OneGraphModel) -> ModuleType:
    """The export module of `model`'s kind (export/kinds/decoder_only.py or encoder_only.py)."""
    return kind_module(model.cfg.architecture)


def session_run(session: ort.InferenceSession) -> Run:
    """An onnxruntime session as a `Run` (outputs in graph order)."""
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: session.run(names, feeds)


def random_ids(cfg: ModelConfig, batch: int, length: int) -> Tensor:
    """Random non-special ids int64 (batch, length): export examples."""
    return torch.randint(len(SPECIAL_TOKENS), cfg.src_vocab_size, (batch, length))


def run_info(info: GraphInfo, path: Path) -> GraphInfo:
    """`info` with the inputs and outputs as saved at `path` now."""
    proto = onnx.load(str(path), load_external_data=False)
    info.inputs, info.outputs = _value_info(proto.graph.input), _value_info(proto.graph.output)
    info.bytes = path.stat().st_size
    return info


def run_one_graph_parity(
    model: OneGraphModel,
    run: Run,
    sources: Sequence[Sequence[int]],
    *,
    source_description: str = "random",
    texts: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
) -> dict[str, Any]:
    """Levels 1-3 of a GPT or BERT graph (`run`) vs `model`, as export/verify.run_parity
    reports them. GPT `sources` are prompts (ids without `<s>`), BERT ones end with `</s>`."""
    model.eval()
    start = time.perf_counter()
    with single_thread():
        levels = kind(model).parity_levels(model, run, sources, texts, max_new_tokens)
    return parity_report(*levels, source_description, start)


def open_run(path: Path) -> Run:
    """A one-thread CPU session of a graph file, as a `Run`."""
    options = session_options(threads=1)
    return session_run(ort.InferenceSession(str(path), options, ["CPUExecutionProvider"]))


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


def build_one_graph_variants(
    directory: Path,
    model: OneGraphModel,
    tokenizers: TokenizerPair,
    held: HeldOut | None,
    options: VariantOptions,
    say: Progress,
) -> dict[str, dict[str, Any]]:
    """The manifest's `variants` table: fp32, and int8 behind its gate when asked."""
    unknown = [n for n in options.names if n not in GRAPH_FILES]
    if unknown:
        raise OptionsError(
            f"variants {', '.join(unknown)} are not built for {kind(model).NAME} "
            f"bundles; choose from {', '.join(GRAPH_FILES)}"
        )
    table: dict[str, dict[str, Any]] = {"fp32": {"verified": held is not None, "gate": None}}
    reference = None
    if held is not None:
        inputs = kind(model).graph_inputs(model, held)
        reference = kind(model).outputs(
            model, open_run(directory / C.MODEL_FILE), inputs, tokenizers
        )
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
            got = kind(model).outputs(model, open_run(directory / INT8_FILE), inputs, tokenizers)
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


def export_one_graph(
    model: OneGraphModel,
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
    out, options, module = Path(out), variants or VariantOptions(), kind(model)
    refuse_existing(out, force)
    if verify and held is None:
        raise OptionsError("verifying a GPT or BERT export needs held-out inputs")
    model.eval()
    start = time.perf_counter()
    vocabulary = fingerprints(tokenizers)
    with atomic_directory(out) as tmp:
        say(f"export {module.NAME} graph")
        graph = module.export_graph(model, tmp / C.MODEL_FILE, opset, graph_metadata(vocabulary))
        say(f"  {C.MODEL_FILE}: {graph.bytes / 1e6:.2f} MB in {graph.seconds:.1f} s")
        parity: dict[str, Any] = {"skipped": True}
        if verify:
            say(f"parity levels 1-3 on {len(held.sources)} inputs ({held.description})")
            parity = run_one_graph_parity(
                model,
                open_run(tmp / C.MODEL_FILE),
                module.graph_inputs(model, held),
                source_description=held.description,
                texts=held.texts,
            )
            check_parity(parity)
        held = held if verify else None
        table = build_one_graph_variants(tmp, model, tokenizers, held, options, say)
        say("write config, tokenizers, manifest")
        module.write_extra_files(model.cfg, tmp)
        files = tokenizers.save(tmp, model.cfg.max_len)
        graphs = {"model": graph}
        write_json(tmp / C.CONFIG_FILE, bundle_config(model.cfg, files, graphs, task, module.NAME))
        min_ort = min_onnxruntime(graph.opset, graph.ir_version)
        fields = {"kind": module.NAME, "architecture": model.cfg.architecture}
        fields[MANIFEST_KEY] = vocabulary
        manifest = write_manifest(
            tmp, bundle_manifest(graphs, start, table, parity, min_ort, **fields)
        )
    say(f"wrote {out}")
    return manifest


def verify_one_graph(
    bundle: Path,
    manifest: dict[str, Any],
    model: OneGraphModel,
    tokenizers: TokenizerPair,
    held: HeldOut,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Parity levels 1-3 of a GPT or BERT bundle's fp32 graph against `model` (the bundle
    already passed `load_bundle`'s checks and matches the model's config: export/pipeline.py
    `verify_bundle`); ParityError when a level fails."""
    say = progress or (lambda _: None)
    say(f"parity levels 1-3 on {len(held.sources)} inputs ({held.description})")
    graph = bundle / manifest["variants"]["fp32"]["model"]
    report = run_one_graph_parity(
        model,
        open_run(graph),
        kind(model).graph_inputs(model, held),
        source_description=held.description,
        texts=held.texts,
    )
    check_parity(report)
    return report
