"""What the one-graph kinds (decoder-only GPT, encoder-only BERT) share in export: running a
graph or the PyTorch model on the graph's feeds, parity in the report format of
export/parity.py, the int8 and fp16 variants behind their gates, and writing the bundle
(`model.onnx`, `model.int8.onnx`, `model.fp16.onnx`, config.json, tokenizers, manifest.json
with parity) with the same atomic write, manifest structure and checksums as the
encoder–decoder's (kinds/seq2seq/bundle.py).

    manifest = export_one_graph(source, "bundles/words", ExportOptions())
    report = run_one_graph_parity(model, session_run(session), prompts)

What differs between the kinds (the graph, its parity levels, what a held-out input becomes,
what the gate compares, GPT's genai_config.json) is each kind's module: `kind(model)` finds
it through the registry (export/kinds/__init__.py). Parity runs on the held-out inputs; the
int8 and fp16 variants (converted as the encoder–decoder's: export/quantize.py,
export/convert.py) must load on onnxruntime's CPU provider and are gated like the
encoder–decoder's: greedy outputs (GPT) or predicted labels (BERT) on the same inputs, the
task metric (exact match) against the references, at most `max_metric_drop` points below
fp32; a miss raises `GateError` (no layer-exclusion search; fp16 first converts again with
LayerNormalization and Softmax in float32 and gates that: `fp16_entry`).
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
from edgeseq.runtime.bundle import Bundle
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.kinds.ort_step import ORT_TO_NUMPY
from edgeseq.runtime.manifest import write_manifest
from edgeseq.runtime.providers import session_options
from edgeseq.runtime.tokenizer import TokenizerPair
from edgeseq.runtime.vocabulary import MANIFEST_KEY, fingerprints, graph_metadata

from ..bundle import bundle_config, bundle_manifest, min_onnxruntime, refuse_existing, write_json
from ..convert import FP16_ATTEMPTS, FP16_KEPT_OPS, check_loads, convert_fp16, fp16_note, fp16_ops
from ..external_data import graph_bytes
from ..gate import GateError, gate_numbers, gate_row, gate_summary, raise_if_missed
from ..heldout import HeldOut
from ..onnx_export import GraphInfo, value_info
from ..options import ExportOptions, held_out
from ..parity import check_parity, parity_report, single_thread
from ..quantize import OUTPUT_GROUP, quantize_graph
from ..sources import SourceError, SourceModel
from ..variants import VariantOptions, check_supported, finish_table
from . import kind_module

Run = Callable[[dict[str, np.ndarray]], list[np.ndarray]]  # graph feeds -> graph outputs
LEVEL2_ROWS = 8
MAX_REPORTED_MISMATCHES = 5
EXAMPLE_BATCH, EXAMPLE_NEW = 2, 4  # export examples: >= 2 on every dynamic axis
INT8_FILE = "model.int8.onnx"
FP16_FILE = "model.fp16.onnx"
GATE_HINT = "export without %s or raise --max-metric-drop"
GRAPH_FILES = {"fp32": C.MODEL_FILE, "int8": INT8_FILE, "fp16": FP16_FILE}
Progress = Callable[[str], None]
OneGraphModel = Any  # DecoderOnlyTransformer | EncoderOnlyTransformer


def kind(model: OneGraphModel) -> ModuleType:
    """The export module of `model`'s kind (export/kinds/decoder_only.py or encoder_only.py)."""
    return kind_module(model.cfg.architecture)


def session_run(session: ort.InferenceSession) -> Run:
    """An onnxruntime session as a `Run` (outputs in graph order) whose float feeds are cast
    to the element types the graph declares: float32 arrays feed an fp16 graph's float16
    cache (GPT's `past_key_values.*`) as they feed the fp32 graph."""
    names = [o.name for o in session.get_outputs()]
    floats = {a.name: ORT_TO_NUMPY[a.type] for a in session.get_inputs() if a.type in ORT_TO_NUMPY}

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        cast = {k: v.astype(floats[k], copy=False) if k in floats else v for k, v in feeds.items()}
        return session.run(names, cast)

    return run


def random_ids(cfg: ModelConfig, batch: int, length: int) -> Tensor:
    """Random non-special ids int64 (batch, length): export examples."""
    return torch.randint(len(SPECIAL_TOKENS), cfg.src_vocab_size, (batch, length))


def run_info(info: GraphInfo, path: Path) -> GraphInfo:
    """`info` with the inputs and outputs as saved at `path` now."""
    proto = onnx.load(str(path), load_external_data=False)
    info.inputs, info.outputs = value_info(proto.graph.input), value_info(proto.graph.output)
    info.bytes = graph_bytes(path)
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
    """The gate numbers (export/gate.py) of a variant's outputs `other` against fp32's:
    exact match against the references, or agreement with fp32 without them."""
    agreement = float(np.mean([a == b for a, b in zip(fp32, other, strict=True)]))
    if held.references is None:
        metric, ref_score, score = "agreement", 1.0, agreement
    else:
        refs = held.references
        ref_score = float(np.mean([t in r for t, r in zip(fp32, refs, strict=True)]))
        score = float(np.mean([t in r for t, r in zip(other, refs, strict=True)]))
        metric = "exact_match"
    return gate_numbers(
        metric, ref_score, score, agreement=agreement, max_drop=max_drop, inputs=len(fp32),
        source=held.description,
    )  # fmt: skip


def build_one_graph_variants(
    directory: Path,
    model: OneGraphModel,
    tokenizers: TokenizerPair,
    held: HeldOut | None,
    options: VariantOptions,
    say: Progress,
) -> dict[str, dict[str, Any]]:
    """The manifest's `variants` table: fp32, and int8 and fp16 behind their gates when
    asked; GraphLoadError when onnxruntime cannot load a variant's graph."""
    check_supported(options.names, tuple(GRAPH_FILES), kind(model).NAME)
    table: dict[str, dict[str, Any]] = {"fp32": {"verified": held is not None, "gate": None}}
    reference, inputs = None, []
    if held is not None:
        inputs = kind(model).graph_inputs(model, held)
        reference = kind(model).outputs(
            model, open_run(directory / C.MODEL_FILE), inputs, tokenizers
        )

    def gated(name: str, entry: dict[str, Any]) -> dict[str, Any]:
        """`entry` with the gate of variant `name` against fp32 (`gate` None without the
        held-out inputs; `verified` False on a miss, which the caller raises)."""
        check_loads([directory / GRAPH_FILES[name]], name)
        entry |= {"gate": None, "verified": False}
        if reference is None or held is None:
            return entry
        run = open_run(directory / GRAPH_FILES[name])
        got = kind(model).outputs(model, run, inputs, tokenizers)
        g = entry["gate"] = gate(reference, got, held, options.max_metric_drop)
        entry["verified"] = g["passed"]
        say(
            f"  {name} gate: {g['metric']} {g['fp32']:.4f} -> {g['variant']:.4f}, agreement "
            f"{g['agreement']:.1%}: {'ok' if g['passed'] else 'FAIL'}"
        )
        return entry

    if "int8" in options.names:
        say("variant int8")
        table["int8"] = gated("int8", int8_entry(directory, options))
        if table["int8"]["gate"] is not None:
            raise_if_missed("int8", table["int8"]["gate"], GATE_HINT % "int8")
    if "fp16" in options.names:
        say("variant fp16")
        table["fp16"] = fp16_entry(directory, gated, say)
    files = {name: {"model": GRAPH_FILES[name]} for name in table}
    finish_table(directory, table, files, {name: name for name in table})
    return table


def fp16_entry(
    directory: Path, gated: Callable[[str, dict[str, Any]], dict[str, Any]], say: Progress
) -> dict[str, Any]:
    """Convert the fp32 graph to `model.fp16.onnx` with every operator in float16 (but the
    logits: export/convert.py) and gate it with `gated`; when it misses, convert again with
    `FP16_KEPT_OPS` in float32 and gate that; GateError with both rows when it misses too.
    Return the gated entry (`fp32_ops`: the conversion the bundle holds)."""
    attempts: list[dict[str, Any]] = []
    for fp32_ops in FP16_ATTEMPTS:
        kept = convert_fp16(directory / C.MODEL_FILE, directory / FP16_FILE, fp32_ops)
        entry = gated("fp16", {"fp16": {"fp32_ops": list(fp32_ops), "fp32_nodes": kept}})
        if entry["gate"] is None:  # --no-verify
            return entry
        attempts.append({"fp32_ops": list(fp32_ops)} | gate_row(entry["gate"]))
        if entry["verified"]:
            entry["fp16"]["search"] = attempts
            return entry | {"note": fp16_note()}
        say(f"  fp16 misses the gate with {fp16_ops(fp32_ops)}")
    raise GateError(
        f"fp16 misses the accuracy gate even with {', '.join(FP16_KEPT_OPS)} in float32: "
        f"{gate_summary(entry['gate'])}; {GATE_HINT % 'fp16'}",
        "fp16",
        attempts,
    )


def int8_entry(directory: Path, options: VariantOptions) -> dict[str, Any]:
    """Quantize the fp32 graph to `model.int8.onnx`; return the entry's `quantization`."""
    nodes = quantize_graph(
        directory / C.MODEL_FILE,
        directory / INT8_FILE,
        # No exclusion search here: the output head stays fp32 unless --quantize-all.
        exclude=() if options.quantize_all else (OUTPUT_GROUP,),
        quantize_all=options.quantize_all,
        per_channel=options.per_channel,
        reduce_range=options.reduce_range,
    )
    return {
        "quantization": {
            "method": "onnxruntime quantize_dynamic: int8 weights, uint8 activations",
            "per_channel": options.per_channel,
            "reduce_range": options.reduce_range,
            "quantize_all": options.quantize_all,
            "quantized_nodes": len(nodes["quantized"]),
            "fp32_nodes": nodes["kept"],
        }
    }


def export_one_graph(
    source: SourceModel, out: str | Path, options: ExportOptions
) -> dict[str, Any]:
    """Export a GPT or BERT `source` to a bundle directory `out`; return its manifest. With
    `options.verify`, parity failures raise `ParityError`, a missed int8 gate `GateError`,
    and nothing is written."""
    model, tokenizers, say = source.model, source.tokenizers, options.say
    out, module = Path(out), kind(model)
    refuse_existing(out, options.force)
    if source.reference is not None:
        raise SourceError(
            f"{source.description}: parity against the source model is built for "
            "encoder-decoder models only; import a decoder-only or encoder-only model later"
        )
    if not options.fuse:
        say(f"note: {module.NAME} graphs have no fused attention; --no-fuse changes nothing")
    held = held_out(source, options) if options.verify else None
    model.eval()
    start = time.perf_counter()
    vocabulary = fingerprints(tokenizers)
    with atomic_directory(out) as tmp:
        say(f"export {module.NAME} graph")
        metadata = graph_metadata(vocabulary)
        graph = module.export_graph(model, tmp / C.MODEL_FILE, options.opset, metadata)
        say(f"  {C.MODEL_FILE}: {graph.bytes / 1e6:.2f} MB in {graph.seconds:.1f} s")
        parity: dict[str, Any] = {"skipped": True}
        if held is not None:
            parity = one_graph_parity(tmp / C.MODEL_FILE, model, held, say)
        table = build_one_graph_variants(tmp, model, tokenizers, held, options.variants, say)
        say("write config, tokenizers, manifest")
        module.write_extra_files(model.cfg, tmp)
        files = tokenizers.save(tmp, model.cfg.max_len)
        graphs = {"model": graph}
        config = bundle_config(model.cfg, files, graphs, source.task, module.NAME)
        write_json(tmp / C.CONFIG_FILE, config)
        min_ort = min_onnxruntime(graph.opset, graph.ir_version)
        fields = {"kind": module.NAME, "architecture": model.cfg.architecture}
        fields[MANIFEST_KEY] = vocabulary
        manifest = write_manifest(
            tmp, bundle_manifest(graphs, start, table, parity, min_ort, **fields)
        )
    say(f"wrote {out}")
    return manifest


def one_graph_parity(
    graph: Path, model: OneGraphModel, held: HeldOut, say: Progress
) -> dict[str, Any]:
    """Parity levels 1-3 of the graph file `graph` against `model` on `held`; ParityError
    when a level fails."""
    say(f"parity levels 1-3 on {len(held.sources)} inputs ({held.description})")
    report = run_one_graph_parity(
        model,
        open_run(graph),
        kind(model).graph_inputs(model, held),
        source_description=held.description,
        texts=held.texts,
    )
    check_parity(report)
    return report


def verify_one_graph(bundle: Bundle, source: SourceModel, options: ExportOptions) -> dict[str, Any]:
    """Parity levels 1-3 of a GPT or BERT bundle's fp32 graph against `source`'s model (the
    bundle passed `load_bundle`'s checks and matches the model's config: export/pipeline.py
    `verify_bundle`); ParityError when a level fails."""
    graph = bundle.model_graph("fp32")
    return one_graph_parity(graph, source.model, held_out(source, options), options.say)
