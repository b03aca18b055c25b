"""The encoder–decoder's precision variants (int8, fp16, ORT format), each behind the
accuracy gate (export/gate.py), and their speed.

    table = build_variants(bundle_dir, config, tokenizers, held, options)  # manifest entries

Every variant other than fp32 is decoded greedily on the held-out inputs of the model's
task and compared with the fp32 graphs: the rate of token sequences identical to fp32's
("agreement") and the task metric against the references for both (WER for g2p and for
the references of a --data file, exact match otherwise; with no references, agreement
itself), and the metric's drop in percentage points. A drop above `max_metric_drop` fails
the gate: int8 is then quantized again with whole layer groups kept in fp32, one more group
per round, keeping the group whose exclusion helps most, until it passes (greedy forward
search); when nothing passes, or another variant fails, `GateError` carries the table of
what was tried. The extra graphs of a precision (the steps and in-place decoders) are
quantized or converted as its decoder was (`quantize_like_int8`, `add_precisions`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.kinds.seq2seq import OrtStep
from edgeseq.runtime.metrics import score
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.prefix import forced
from edgeseq.runtime.search import greedy_search
from edgeseq.runtime.search_timing import BenchSpec, time_search
from edgeseq.runtime.tokenizer import TokenizerPair

from ...convert import (
    FP16_ATTEMPTS,
    FP16_KEPT_OPS,
    REQUIRED_OPERATORS_FILE,
    check_loads,
    convert_fp16,
    convert_ort,
    fp16_note,
    fp16_ops,
)
from ...external_data import load_graph
from ...gate import GateError, gate_numbers, gate_row, gate_summary, raise_if_missed
from ...heap import release_free_heap
from ...heldout import HeldOut
from ...quantize import OUTPUT_GROUP, PER_CHANNEL, REDUCE_RANGE, graph_groups, quantize_graph
from ...variants import PRECISIONS, VariantOptions, finish_table
from .parity import LEVEL3_BATCH, open_engine

Progress = Callable[[str], None]

GRAPH_FILES = {
    "fp32": (C.ENCODER_FILE, C.DECODER_FILE),
    "int8": ("encoder.int8.onnx", "decoder.int8.onnx"),
    "fp16": ("encoder.fp16.onnx", "decoder.fp16.onnx"),
    "ort": ("encoder.ort", "decoder.ort"),
}


PRECISION = {"fp32": "fp32", "int8": "int8", "fp16": "fp16", "ort": "fp32"}


SPEED_REPEATS = 3  # passes per variant, interleaved; the fastest counts


@dataclass
class Reference:
    """fp32's greedy outputs on the held-out set and its score: what variants are held to."""

    held: HeldOut
    tokenizers: TokenizerPair
    max_new_tokens: int
    metric: str
    ids: list[list[int]] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)

    def decode(self, engine: OrtStep) -> list[list[int]]:
        """Greedy ids of every held-out source, LEVEL3_BATCH at a time, the held-out target
        prefix (a target language) forced first as generate forces it."""
        out: list[list[int]] = []
        model = forced(engine, [self.held.target_prefix])
        for start in range(0, len(self.held.sources), LEVEL3_BATCH):
            src = right_pad(self.held.sources[start : start + LEVEL3_BATCH], engine.pad_id)
            out += greedy_search(model, src, self.max_new_tokens)
        return out

    def score(self, ids: list[list[int]]) -> dict[str, float]:
        """Task scores of `ids` against the references, plus "agreement" with fp32."""
        agreement = sum(a == b for a, b in zip(ids, self.ids, strict=True)) / len(ids)
        if self.held.references is None:
            return {"count": float(len(ids)), "agreement": agreement}
        hyps = [self.tokenizers.target.decode(row) for row in ids]
        tokenize = list if self.held.target_chars else str.split
        return score(hyps, self.held.references, tokenize) | {"agreement": agreement}

    def gate(self, engine: OrtStep, max_drop: float) -> dict[str, Any]:
        """The gate numbers of `engine` against fp32 (export/gate.py)."""
        scores = self.score(self.decode(engine))
        return gate_numbers(
            self.metric,
            self.scores[self.metric],
            scores[self.metric],
            agreement=scores["agreement"],
            max_drop=max_drop,
            inputs=len(self.held.sources),
            source=self.held.description,
            provider="CPUExecutionProvider",
            scores={k: round(v, 6) for k, v in scores.items()},  # fp32's: its own entry
        )


def fp32_reference(
    directory: Path, config: ModelConfig, tokenizers: TokenizerPair, held: HeldOut, max_new: int
) -> Reference:
    """Decode the held-out set with the fp32 graphs in `directory`."""
    if held.references is None:
        metric = "agreement"
    else:
        metric = "wer" if held.task_name in ("g2p", "data") else "exact_match"
    ref = Reference(held, tokenizers, max_new, metric)
    ref.ids = ref.decode(open_variant(directory, "fp32", config))
    ref.scores = ref.score(ref.ids)
    return ref


def open_variant(directory: Path, variant: str, config: ModelConfig) -> OrtStep:
    """One-thread CPU sessions of precision `variant`'s two graphs in `directory`."""
    encoder, decoder = GRAPH_FILES[variant]
    return open_engine(directory / encoder, directory / decoder, config)


# -- building each variant --------------------------------------------------------------------
def build_int8(
    directory: Path,
    config: ModelConfig,
    ref: Reference | None,
    options: VariantOptions,
    say: Progress,
) -> dict[str, Any]:
    """Quantize both graphs (GraphLoadError when onnxruntime cannot load one); with a
    reference, search layer exclusions until the gate passes."""
    sources = [directory / name for name in GRAPH_FILES["fp32"]]
    targets = [directory / name for name in GRAPH_FILES["int8"]]

    def quantize(excluded: Sequence[str]) -> dict[str, list[str]]:
        done: dict[str, list[str]] = {"quantized": [], "kept": []}
        for source, target in zip(sources, targets, strict=True):
            nodes = quantize_graph(
                source,
                target,
                excluded,
                quantize_all=options.quantize_all,
                per_channel=options.per_channel,
                reduce_range=options.reduce_range,
            )
            for key in done:
                done[key] += nodes[key]
        return done

    def describe(excluded: Sequence[str], nodes: dict[str, list[str]]) -> dict[str, Any]:
        kept = ["embeddings", "positional table"]
        return {
            "method": "onnxruntime quantize_dynamic: int8 weights, uint8 activations at run time",
            "per_channel": options.per_channel,
            "reduce_range": options.reduce_range,
            "quantize_all": options.quantize_all,
            "quantized_nodes": len(nodes["quantized"]),
            "fp32_nodes": nodes["kept"],
            "excluded_groups": list(excluded),
            "kept_fp32": [] if options.quantize_all else kept,
        }

    nodes = quantize([])
    check_loads(targets, "int8")
    if ref is None:
        return {"quantization": describe([], nodes)}
    attempts: list[dict[str, Any]] = []

    def trial(excluded: list[str]) -> dict[str, Any]:
        numbers = ref.gate(open_variant(directory, "int8", config), options.max_metric_drop)
        attempts.append({"excluded_groups": excluded} | gate_row(numbers))
        return numbers

    best, excluded = trial([]), []
    models = [load_graph(path) for path in sources]
    remaining = graph_groups(*models)
    while not best["passed"] and remaining:
        say(f"  int8 misses the gate ({gate_summary(best)}); trying {len(remaining)} exclusions")
        results = []
        for group in remaining:
            quantize([*excluded, group])
            results.append((group, trial([*excluded, group])))
        group, best = min(results, key=lambda r: (r[1]["drop_points"], -r[1]["agreement"]))
        excluded.append(group)
        remaining.remove(group)
        nodes = quantize(excluded)  # the chosen one, written last
    if not best["passed"]:
        raise GateError(
            f"int8 misses the accuracy gate even with every layer group in fp32: "
            f"{gate_summary(best)}; tried {len(attempts)} configurations",
            "int8",
            attempts,
        )
    return {"quantization": describe(excluded, nodes) | {"search": attempts}, "gate": best}


def build_fp16(
    directory: Path, config: ModelConfig, ref: Reference | None, max_drop: float, say: Progress
) -> dict[str, Any]:
    """Convert both graphs to fp16 (GraphLoadError when onnxruntime cannot load one): every
    operator float16 but the logits and the search's outputs; with a reference, gate them on
    the CPU provider, and when they miss, convert again with `FP16_KEPT_OPS` (Softmax,
    LayerNormalization) in float32 and gate that; GateError with both rows when it misses
    too. The entry's `fp32_ops` says which conversion the bundle holds."""
    attempts: list[dict[str, Any]] = []
    for fp32_ops in FP16_ATTEMPTS:
        kept: list[str] = []
        for source, target in zip(GRAPH_FILES["fp32"], GRAPH_FILES["fp16"], strict=True):
            kept += convert_fp16(directory / source, directory / target, fp32_ops)
        check_loads([directory / name for name in GRAPH_FILES["fp16"]], "fp16")
        entry: dict[str, Any] = {"fp16": {"fp32_ops": list(fp32_ops), "fp32_nodes": kept}}
        if ref is None:
            return entry
        numbers = ref.gate(open_variant(directory, "fp16", config), max_drop)
        attempts.append({"fp32_ops": list(fp32_ops)} | gate_row(numbers))
        if numbers["passed"]:
            entry["fp16"]["search"] = attempts
            return entry | {"gate": numbers, "note": fp16_note()}
        say(f"  fp16 misses the gate ({gate_summary(numbers)}) with {fp16_ops(fp32_ops)}")
    raise GateError(
        f"fp16 misses the accuracy gate even with {', '.join(FP16_KEPT_OPS)} in float32: "
        f"{gate_summary(numbers)}; export without fp16 or raise --max-metric-drop",
        "fp16",
        attempts,
    )


def build_ort(directory: Path) -> dict[str, Any]:
    """Convert both fp32 graphs to ORT format (GraphLoadError when onnxruntime cannot load
    one)."""
    import onnxruntime as ort

    convert_ort([directory / name for name in GRAPH_FILES["fp32"]], directory)
    check_loads([directory / name for name in GRAPH_FILES["ort"]], "ort")
    return {
        "required_operators": REQUIRED_OPERATORS_FILE,
        "converted_with_onnxruntime": ort.__version__,
        "note": "ORT format of the fp32 graphs (optimization level all); load it with an "
        "onnxruntime at least as new as converted_with_onnxruntime",
    }


# -- speed ------------------------------------------------------------------------------------
def measure_speed(
    directory: Path,
    names: Sequence[str],
    config: ModelConfig,
    sources: Sequence[Sequence[int]],
    max_new_tokens: int,
) -> dict[str, dict[str, Any]]:
    """Session load time and greedy tokens/s (batch 1, one thread, CPU) of each variant on
    `sources`, timed as `edgeseq bench` times (runtime/search_timing.py): SPEED_REPEATS
    passes per variant, interleaved, the fastest of each counts. Tokens are those generated,
    `</s>` included."""
    spec = BenchSpec([list(s) for s in sources], (1,), 1, 1, max_new_tokens, warmup=False)
    best = {name: {"load": float("inf"), "rate": 0.0, "tokens": 0} for name in names}
    for _ in range(SPEED_REPEATS):
        for name in names:
            start = time.perf_counter()
            engine = open_variant(directory, name, config)
            loaded = time.perf_counter()
            stats = time_search(engine, spec)["1"]
            del engine  # before the next variant's sessions open: one graph's weights at a time
            release_free_heap()
            entry = best[name]
            entry["load"] = min(entry["load"], loaded - start)
            entry["rate"] = max(entry["rate"], stats["tokens_per_s"])
            entry["tokens"] = stats["tokens"]
    return {
        name: {
            "load_seconds": round(b["load"], 4),
            "tokens_per_second": round(b["rate"], 1) if b["rate"] > 0 else None,
            "tokens": b["tokens"],
            "inputs": len(sources),
            "batch": 1,
            "threads": 1,
            "repeats": SPEED_REPEATS,
            "provider": "CPUExecutionProvider",
        }
        for name, b in best.items()
    }


# -- all variants -----------------------------------------------------------------------------
def build_variants(
    directory: str | Path,
    config: ModelConfig,
    tokenizers: TokenizerPair,
    held: HeldOut | None,
    options: VariantOptions,
    *,
    fp32_verified: bool,
    max_new_tokens: int | None = None,
    progress: Progress | None = None,
) -> dict[str, dict[str, Any]]:
    """Write the requested variants' graphs next to the fp32 graphs in `directory` and
    return the manifest's `variants` table. With `held` (None: --no-verify), gate every
    non-fp32 variant against fp32 and measure speed; a missed gate raises GateError."""
    say = progress or (lambda _: None)
    directory = Path(directory)
    limit = max_new_tokens if max_new_tokens is not None else config.max_len
    ref = fp32_reference(directory, config, tokenizers, held, limit) if held else None
    table: dict[str, dict[str, Any]] = {"fp32": {"verified": fp32_verified}}
    if ref is not None:
        table["fp32"]["metric"] = ref.metric
        table["fp32"]["scores"] = {k: round(v, 6) for k, v in ref.scores.items()}
    for name in options.names[1:]:
        if name not in PRECISIONS:
            continue  # a graph variant: export/kinds/seq2seq/graph_variants.py
        say(f"variant {name}")
        if name == "int8":
            entry = build_int8(directory, config, ref, options, say)
        elif name == "fp16":
            entry = build_fp16(directory, config, ref, options.max_metric_drop, say)
        else:
            entry = build_ort(directory)
            if ref is not None:
                engine = open_variant(directory, name, config)
                entry["gate"] = raise_if_missed(name, ref.gate(engine, options.max_metric_drop))
        entry.setdefault("verified", "gate" in entry)
        if ref is None:
            entry.setdefault("note", "exported with --no-verify: no accuracy gate measured")
        table[name] = entry
    files = {
        name: dict(zip(("encoder", "decoder"), GRAPH_FILES[name], strict=True)) for name in table
    }
    finish_table(directory, table, files, PRECISION)
    if held is not None:
        say(f"speed: greedy, batch 1, 1 thread, {options.speed_inputs} inputs per variant")
        runnable = [name for name, entry in table.items() if name == "fp32" or entry["verified"]]
        sources = held.sources[: options.speed_inputs]
        speeds = measure_speed(directory, runnable, config, sources, limit)
        for name, speed in speeds.items():
            table[name]["speed"] = speed
    for entry in table.values():
        entry.setdefault("speed", None)
    return table


def quantize_like_int8(source: Path, target: Path, int8_entry: dict[str, Any]) -> None:
    """Quantize `source` to `target` with the settings (and fp32-kept layer groups) the int8
    variant's decoder was quantized with."""
    how = int8_entry.get("quantization") or {}
    excluded = list(how.get("excluded_groups") or [])
    if OUTPUT_GROUP in how.get("kept_fp32", []):  # bundles that kept it in fp32 by default
        excluded.append(OUTPUT_GROUP)
    quantize_graph(
        source,
        target,
        excluded,
        quantize_all=bool(how.get("quantize_all", False)),
        per_channel=bool(how.get("per_channel", PER_CHANNEL)),
        reduce_range=bool(how.get("reduce_range", REDUCE_RANGE)),
    )


def add_precisions(
    entry: dict[str, Any],
    directory: Path,
    files: dict[str, str],
    table: dict[str, dict[str, Any]],
    say: Progress,
) -> list[str]:
    """For an extra decoder whose fp32 graph `files["fp32"]` is written: quantize its int8
    graph when `table` has int8 (`quantize_like_int8`), convert its fp16 graph when `table`
    has fp16 (with the operators the fp16 decoder kept in float32), add each precision's file
    entry to `entry`; return the precisions."""
    precisions = [p for p in files if p in table]
    for precision in precisions:
        path = directory / files[precision]
        if precision == "int8":
            quantize_like_int8(directory / files["fp32"], path, table["int8"])
            megabytes = path.stat().st_size / 1e6
            say(f"  {path.name}: {megabytes:.2f} MB (quantized as the int8 decoder)")
        elif precision == "fp16":
            fp32_ops = table["fp16"]["fp16"]["fp32_ops"]
            convert_fp16(directory / files["fp32"], path, fp32_ops)
            check_loads([path], "fp16")
            megabytes = path.stat().st_size / 1e6
            say(f"  {path.name}: {megabytes:.2f} MB (converted as the fp16 decoder)")
        entry[precision] = {
            "file": path.name,
            "decoder": GRAPH_FILES[precision][1],  # the graph it stands in for
            "bytes": path.stat().st_size,
        }
    return precisions
