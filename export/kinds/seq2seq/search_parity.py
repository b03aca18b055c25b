"""Write the one-graph search variant and its parity evidence (the report's fourth group).

    manifest["search"] = write_search_graphs(directory, config, table)   # docs/bundle.md
    group = search_parity_group(directory, config, tokenizers, ["fp32", "int8"], held, 64)

For each graph variant the bundle has (fp32 always, int8 and ort when exported) it writes
`search.onnx` / `search.int8.onnx` (search_graph.py) / `search.ort` (the ORT-format
conversion of search.onnx). On the level-3 inputs it then
runs the graph and the Python loop (`beam_search` over the same precision's two graphs) at
beam 1 (greedy) and beam `LEVEL3_BEAM_SIZE`, one input at a time and in right-padded
batches of `LEVEL3_BATCH` (mixed lengths), and counts identical best hypotheses. fp32 must
match on every input (`search_failure` otherwise); int8 and ort report theirs against their own
loops, int8 also its agreement with fp32 and the task metric of its greedy outputs.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from edgeseq.runtime import constants as C
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.graph_search import GraphSearch
from edgeseq.runtime.kinds.seq2seq import OrtStep
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import GenerationOptions, Hypothesis, beam_search
from edgeseq.runtime.tokenizer import TokenizerPair

from ...convert import convert_ort
from ...external_data import graph_bytes
from ...gate import LOWER_IS_BETTER
from ...heldout import HeldOut
from ...parity import MAX_REPORTED_MISMATCHES, parity_group
from .parity import LEVEL3_BATCH, LEVEL3_BEAM_SIZE, cpu_session, open_engine
from .precisions import GRAPH_FILES, Reference
from .search_graph import SEARCH_INPUTS, SEARCH_OUTPUTS, write_search_graph

SEARCH_OPERATORS_FILE = "search.required_operators.config"  # for a reduced onnxruntime build
SEARCH_BEAMS = (1, LEVEL3_BEAM_SIZE)
SEARCH_BATCHES = (1, LEVEL3_BATCH)

Progress = Callable[[str], None]


def open_graph(path: Path, config: ModelConfig) -> GraphSearch:
    """A one-thread CPU session of the search graph at `path`."""
    return GraphSearch(cpu_session(path), config)


def best_tokens(
    run: Callable[[Any], list[list[Hypothesis]]],
    sources: Sequence[Sequence[int]],
    batch: int,
    pad_id: int,
) -> list[tuple[int, ...]]:
    """Best hypothesis of every source, `batch` right-padded sources per call of `run`."""
    out: list[tuple[int, ...]] = []
    for start in range(0, len(sources), batch):
        out += [hyps[0].tokens for hyps in run(right_pad(sources[start : start + batch], pad_id))]
    return out


def compare(
    loop: OrtStep, graph: GraphSearch, sources: Sequence[Sequence[int]], max_new: int
) -> tuple[list[dict[str, Any]], dict[int, list[tuple[int, ...]]]]:
    """Rows (beam, batch, identical/inputs, first mismatches) of graph vs loop; and the
    graph's best hypotheses per beam size at batch LEVEL3_BATCH."""
    rows, graph_best = [], {}
    for beam in SEARCH_BEAMS:
        options = GenerationOptions(max_new_tokens=max_new, beam_size=beam)
        for batch in SEARCH_BATCHES:
            want = best_tokens(
                lambda src, b=beam: beam_search(loop, src, b, max_new), sources, batch, loop.pad_id
            )
            have = best_tokens(
                lambda src, o=options: graph.search(src, o), sources, batch, loop.pad_id
            )
            if batch == LEVEL3_BATCH:
                graph_best[beam] = have
            differ = [i for i, (a, b) in enumerate(zip(want, have, strict=True)) if a != b]
            rows.append(
                {
                    "beam_size": beam,
                    "batch": batch,
                    "inputs": len(sources),
                    "identical": len(sources) - len(differ),
                    "mismatches": [
                        {"index": i, "loop_ids": list(want[i]), "graph_ids": list(have[i])}
                        for i in differ[:MAX_REPORTED_MISMATCHES]
                    ],
                }
            )
    return rows, graph_best


def _metric(
    ref: Reference | None, ids: list[tuple[int, ...]], fp32: list[tuple[int, ...]]
) -> dict[str, Any]:
    """Agreement of `ids` with fp32's and the task metric of both (when references exist)."""
    agreement = sum(a == b for a, b in zip(ids, fp32, strict=True)) / len(ids)
    out: dict[str, Any] = {"agreement_with_fp32": round(agreement, 6)}
    if ref is None:
        return out
    metric = ref.metric
    ref.ids = [list(t) for t in fp32]
    before = ref.score([list(t) for t in fp32])[metric]
    after = ref.score([list(t) for t in ids])[metric]
    drop = 100 * ((after - before) if LOWER_IS_BETTER[metric] else (before - after))
    return (
        out
        | {"metric": metric, "fp32": round(before, 6), "int8": round(after, 6)}
        | {"drop_points": round(drop, 4)}
    )


def _write_ort(directory: Path) -> dict[str, Any]:
    """Convert search.onnx to ORT format (search.ort, with its own operator config)."""
    with tempfile.TemporaryDirectory(dir=directory, prefix=".search-ort-") as scratch:
        (ort_path,), config = convert_ort([directory / C.SEARCH_FILES["fp32"]], Path(scratch))
        shutil.move(ort_path, directory / C.SEARCH_FILES["ort"])
        shutil.move(config, directory / SEARCH_OPERATORS_FILE)
    return {
        "file": C.SEARCH_FILES["ort"],
        "precision": "fp32",
        "format": "ort",
        "bytes": (directory / C.SEARCH_FILES["ort"]).stat().st_size,
        "required_operators": SEARCH_OPERATORS_FILE,
        "converted_with_onnxruntime": ort.__version__,
    }


def write_search_graphs(
    directory: Path,
    config: ModelConfig,
    table: dict[str, dict[str, Any]],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the search graph of every graph variant in `table` that has one (fp32, int8,
    ort) into `directory`; return its manifest entry."""
    say = progress or (lambda _: None)
    entry: dict[str, Any] = {
        "operator": "com.microsoft.BeamSearch (model_type 1: encoder-decoder)",
        "inputs": [{"name": name, **spec} for name, spec in SEARCH_INPUTS.items()],
        "outputs": [{"name": name, **spec} for name, spec in SEARCH_OUTPUTS.items()],
    }
    for precision in [p for p in C.SEARCH_FILES if p in table]:
        if precision == "ort":
            entry["ort"] = _write_ort(directory)
            say(f"  search.ort: {entry['ort']['bytes'] / 1e6:.2f} MB")
            continue
        encoder, decoder = GRAPH_FILES[precision]
        name = C.SEARCH_FILES[precision]
        info = write_search_graph(
            directory / encoder, directory / decoder, config, directory / name
        )
        say(f"  {name}: {info.bytes / 1e6:.2f} MB in {info.seconds:.1f} s")
        entry[precision] = {
            "file": name,
            "precision": precision,
            "bytes": info.bytes,
            "graphs_bytes": sum(graph_bytes(directory / g) for g in (encoder, decoder)),
            "shared_initializers": info.shared_initializers,
            "shared_bytes": info.shared_bytes,
        }
    return entry


def search_parity_group(
    directory: Path,
    config: ModelConfig,
    tokenizers: TokenizerPair,
    precisions: Sequence[str],
    held: HeldOut,
    limit: int,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The parity group of the search graphs of `precisions` (fp32 first) in `directory`
    against their loops on `held` (see the module docstring)."""
    sources = held.sources
    graph_best: dict[str, dict[int, list[tuple[int, ...]]]] = {}

    def compare_precision(precision: str) -> dict[str, Any]:
        loop = open_engine(*(directory / g for g in GRAPH_FILES[precision]), config)
        graph = open_graph(directory / C.SEARCH_FILES[precision], config)
        rows, graph_best[precision] = compare(loop, graph, sources, limit)
        return {"rows": rows}

    group = parity_group(
        precisions,
        compare_precision,
        lambda fp32: all(r["identical"] == r["inputs"] for r in fp32["rows"]),
        lambda p: (
            f"parity search ({p}): graph vs loop, beams {SEARCH_BEAMS}, batches "
            f"{SEARCH_BATCHES}, {len(sources)} inputs"
        ),
        progress,
        source=held.description,
        max_new_tokens=limit,
    )
    if "int8" in group:
        metric = "wer" if held.task_name in ("g2p", "data") else "exact_match"
        ref = Reference(held, tokenizers, limit, metric) if held.references is not None else None
        group["int8"] |= _metric(ref, graph_best["int8"][1], graph_best["fp32"][1])
    return group


def search_failure(group: dict[str, Any]) -> str:
    """The ParityError message of a failed "search" group: which cells differ and the first
    differing input."""
    bad = [r for r in group["fp32"]["rows"] if r["identical"] != r["inputs"]]
    text = "; ".join(
        f"beam {r['beam_size']} batch {r['batch']}: {r['identical']}/{r['inputs']} identical"
        for r in bad
    )
    first = bad[0]["mismatches"][0]
    return (
        f"the one-graph search variant differs from the Python loop: {text}; input "
        f"#{first['index']}: loop {first['loop_ids']}, graph {first['graph_ids']}"
    )
