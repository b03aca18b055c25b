"""What every kind's bundle writer shares: config.json and manifest.json's fields, the
oldest onnxruntime the graphs need, and the refusal to write over an existing bundle.

    refuse_existing(out, force)                                   # before any slow step
    write_json(tmp / "config.json", bundle_config(cfg, tokenizer_files, graphs, task))
    write_manifest(tmp, bundle_manifest(graphs, started, table, parity, min_ort))

Each kind writes its bundle into a hidden temporary sibling of the target
(runtime/atomic.py) renamed into place only when everything succeeded
(export/kinds/seq2seq/bundle.py, export/kinds/one_graph.py). The format is documented in
docs/bundle.md.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path, PurePath
from typing import Any

from edgeseq.runtime import constants as C
from edgeseq.runtime.bundle import version_key
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import BundleError

from .onnx_export import GraphInfo, edgeseq_version

# Oldest onnxruntime able to load a graph of this IR version / default-domain opset
# (onnxruntime's version matrix); a higher value than listed falls back to the installed one.
MIN_ORT_FOR_IR = {8: "1.14.0", 9: "1.15.0", 10: "1.18.0"}
MIN_ORT_FOR_OPSET = {18: "1.14.0", 19: "1.15.0", 20: "1.17.0", 21: "1.18.0"}


class OutputExistsError(BundleError):
    """The export target exists and `force` was not given."""


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def exporter_versions() -> dict[str, str]:
    """Versions of the packages that produced and verified the graphs."""
    ort = [_version(p) for p in ("onnxruntime-gpu", "onnxruntime")]
    return {
        "torch": _version("torch"),
        "onnx": _version("onnx"),
        "onnxscript": _version("onnxscript"),
        "onnxruntime": next((v for v in ort if v != "not installed"), "not installed"),
    }


def min_onnxruntime(opset: int, ir_version: int, *needs: str) -> str:
    """Oldest onnxruntime that runs graphs of `opset` and `ir_version` and every feature
    whose oldest version is in `needs` (C.MIN_ORT_FUSED_ATTENTION, a graph variant's)."""
    installed = exporter_versions()["onnxruntime"]
    candidates = [
        MIN_ORT_FOR_IR.get(ir_version, installed),
        MIN_ORT_FOR_OPSET.get(opset, installed),
        *needs,
    ]
    return max(candidates, key=version_key)


def portable_task(task: dict[str, Any] | None) -> dict[str, Any] | None:
    """`task` as a bundle records it: a corpus path (task "tsv") is cut to its file name, so
    no bundle file holds a path of the exporting machine. The checkpoint keeps the full path
    (resuming training reads the corpus again); a bundle only documents where it came from."""
    if not task:
        return task
    options = dict(task.get("options") or {})
    if isinstance(options.get("path"), str):
        options["path"] = PurePath(options["path"]).name
    return {**task, "options": options}


def bundle_config(
    cfg: ModelConfig,
    tokenizer_files: list[str],
    graphs: dict[str, GraphInfo],
    task: dict[str, Any] | None,
    kind: str | None = None,
    languages: dict[str, Any] | None = None,
    generation: dict[str, Any] | None = None,
    task_prefixes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The content of a bundle's config.json (see docs/bundle.md): `graphs` maps each graph's
    role ("encoder", "decoder"; "model" for one-graph kinds) to its export info; `kind`
    ("gpt", "bert") is written for one-graph bundles, `languages` for a multilingual model
    (runtime/languages.py), `generation` for a source with generation settings
    (export/sources/generation_config.py), `task_prefixes` for a source with task prefixes
    (T5's task_specific_params)."""
    ids = {"pad": cfg.pad_id, "bos": cfg.bos_id, "eos": cfg.eos_id, "unk": cfg.unk_id}
    tokens = dict(zip(ids, C.SPECIAL_TOKENS, strict=True))
    config = {
        "model": cfg.to_dict(),
        "special_tokens": {role: {"id": i, "token": tokens[role]} for role, i in ids.items()},
        "io": {role: {"inputs": g.inputs, "outputs": g.outputs} for role, g in graphs.items()},
        "tokenizers": {"source": tokenizer_files[0], "target": tokenizer_files[-1]},
        "task": portable_task(task),
    }
    config |= {"languages": languages} if languages else {}
    config |= {"generation": generation} if generation else {}
    config |= {"task_prefixes": task_prefixes} if task_prefixes else {}
    return config | ({"kind": kind} if kind else {})


def bundle_manifest(
    graphs: dict[str, GraphInfo],
    started: float,
    variants: dict[str, Any],
    parity: dict[str, Any],
    min_ort: str,
    **extra: Any,
) -> dict[str, Any]:
    """manifest.json's fields before `write_manifest` adds the format and checksums: the
    versions, the graphs' sizes and export times, the variants table, the parity report and
    `extra` fields (`kind`, `architecture`, `search`)."""
    first = next(iter(graphs.values()))
    return {
        "edgeseq_version": edgeseq_version(),
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "min_onnxruntime": min_ort,
        "opset": first.opset,
        "ir_version": first.ir_version,
        "exporter": exporter_versions(),
        "graphs": {
            role: {"bytes": g.bytes, "export_seconds": round(g.seconds, 2)}
            for role, g in graphs.items()
        },
        "export_seconds": round(time.perf_counter() - started, 2),
        "variants": variants,
        "parity": parity,
        **extra,
    }


def refuse_existing(out: str | Path, force: bool) -> None:
    """Raise OutputExistsError when `out` exists and `force` is not set."""
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not force:
        raise OutputExistsError(f"{out} already exists; pass --force to replace it")


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as JSON with sorted keys and a final newline (config.json's format)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
