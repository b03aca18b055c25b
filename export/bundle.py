"""Write a bundle: both graphs, config.json, tokenizer file(s), manifest.json with parity.

    held = heldout_sources(meta.task, tokenizers, model)          # export/heldout.py
    manifest = export_bundle(model, tokenizers, "bundles/rev", task=meta.task, held=held)
    manifest = export_bundle(..., held=held, variants=VariantOptions(("fp32", "int8")))

The recipe is load -> export encoder -> export decoder -> check -> parity -> variants (each
behind its accuracy gate, export/variants.py) -> write. Every file
is written into a hidden temporary sibling of the target (``.NAME.tmp-XXXX``) that is renamed
into place only when everything succeeded, so an exception, a failed parity check or Ctrl-C
leaves neither a partial bundle nor the temporary directory. An existing target is replaced
only with ``force=True``. The format is documented in docs/bundle.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path, PurePath
from typing import Any

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.atomic import atomic_directory
from edgeseq.runtime.bundle import version_key
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import BundleError, OptionsError
from edgeseq.runtime.manifest import write_manifest
from edgeseq.runtime.tokenizer import TokenizerPair
from edgeseq.runtime.vocabulary import MANIFEST_KEY, fingerprints, graph_metadata

from .heldout import HeldOut
from .in_place_graph import build_in_place_variant
from .in_place_parity import check_in_place_parity
from .limits import LEVEL3_MIN_INPUTS
from .onnx_export import GraphInfo, edgeseq_version, export_decoder, export_encoder
from .search_parity import build_search_variant, check_search_parity
from .source_parity import check_source_parity, source_parity
from .sources import SourceReference
from .steps_graph import build_steps_variant
from .steps_parity import check_steps_parity
from .variants import (
    IN_PLACE_VARIANT,
    SEARCH_VARIANT,
    STEPS_VARIANT,
    VariantOptions,
    build_variants,
)
from .verify import check_parity, open_engine, random_sources, run_parity

# Oldest onnxruntime able to load a graph of this IR version / default-domain opset
# (onnxruntime's version matrix); a higher value than listed falls back to the installed one.
MIN_ORT_FOR_IR = {8: "1.14.0", 9: "1.15.0", 10: "1.18.0"}
MIN_ORT_FOR_OPSET = {18: "1.14.0", 19: "1.15.0", 20: "1.17.0", 21: "1.18.0"}
# Measured with the g2p-en bundle on each onnxruntime release (docs/bundle.md): the fused
# graphs' MultiHeadAttention gives wrong outputs for padded batches before 1.21 (1.20.1
# changed "hello" in a batch of three); BeamSearch refuses the search graph's two-input
# encoder subgraph before 1.22 (1.21.1: "subgraph_t5_encoder ... expect 3 inputs").
MIN_ORT_FUSED_ATTENTION = "1.21.0"
MIN_ORT_SEARCH_GRAPH = "1.22.0"

Progress = Callable[[str], None]


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


def min_onnxruntime(opset: int, ir_version: int, fused: bool = False, search: bool = False) -> str:
    """Oldest onnxruntime that runs graphs of `opset` and `ir_version`, with fused attention
    (`fused`) and the one-graph search variant (`search`)."""
    installed = exporter_versions()["onnxruntime"]
    candidates = [
        MIN_ORT_FOR_IR.get(ir_version, installed),
        MIN_ORT_FOR_OPSET.get(opset, installed),
        *([MIN_ORT_FUSED_ATTENTION] if fused else []),
        *([MIN_ORT_SEARCH_GRAPH] if search else []),
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
) -> dict[str, Any]:
    """The content of a bundle's config.json (see docs/bundle.md): `graphs` maps each graph's
    role ("encoder", "decoder"; "model" for one-graph kinds) to its export info; `kind`
    ("gpt", "bert") is written for one-graph bundles."""
    ids = {"pad": cfg.pad_id, "bos": cfg.bos_id, "eos": cfg.eos_id, "unk": cfg.unk_id}
    tokens = dict(zip(ids, C.SPECIAL_TOKENS, strict=True))
    config = {
        "model": cfg.to_dict(),
        "special_tokens": {role: {"id": i, "token": tokens[role]} for role, i in ids.items()},
        "io": {role: {"inputs": g.inputs, "outputs": g.outputs} for role, g in graphs.items()},
        "tokenizers": {"source": tokenizer_files[0], "target": tokenizer_files[-1]},
        "task": portable_task(task),
    }
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


def export_bundle(
    model: Seq2SeqTransformer,
    tokenizers: TokenizerPair,
    out: str | Path,
    *,
    task: dict[str, Any] | None = None,
    held: HeldOut | None = None,
    opset: int | None = None,
    force: bool = False,
    verify: bool = True,
    max_new_tokens: int | None = None,
    variants: VariantOptions | None = None,
    progress: Progress | None = None,
    fuse: bool = True,
    reference: SourceReference | None = None,
) -> dict[str, Any]:
    """Export `model` to a bundle directory `out` and return its manifest.

    `held` holds the held-out sources (id lists ending with `</s>`) for parity level 3, their
    texts for the report and, from a task, the references that give the variants' accuracy
    gates a task metric (export/heldout.py); without `held` LEVEL3_MIN_INPUTS random sources
    are used and the gates measure agreement with fp32 only. With `verify`, a parity failure
    raises `ParityError`, a variant missing its gate `GateError`, and nothing is written.
    `fuse` exports the graphs with fused attention (`com.microsoft` `MultiHeadAttention`,
    fused projections); `fuse=False` writes standard ONNX operators only. `reference`, the
    model an import adapter mapped (export/sources/), adds the parity group against it
    (export/source_parity.py): the bundle must reproduce the original, not only `model`."""
    say = progress or (lambda _: None)
    out = Path(out)
    refuse_existing(out, force)
    model.eval()
    with atomic_directory(out) as tmp:
        manifest = _write_into(
            model, tokenizers, tmp, task, held, opset, verify, max_new_tokens,
            variants or VariantOptions(), say, fuse, reference,
        )  # fmt: skip
        if (out.exists() or out.is_symlink()) and not force:
            raise OutputExistsError(f"{out} appeared during the export; pass --force to replace it")
    say(f"wrote {out}")
    return manifest


def _write_into(
    model: Seq2SeqTransformer,
    tokenizers: TokenizerPair,
    directory: Path,
    task: dict[str, Any] | None,
    held: HeldOut | None,
    opset: int | None,
    verify: bool,
    max_new_tokens: int | None,
    variants: VariantOptions,
    say: Progress,
    fuse: bool,
    reference: SourceReference | None,
) -> dict[str, Any]:
    """Every step of `export_bundle` inside the (temporary) `directory`."""
    if IN_PLACE_VARIANT in variants.names and not fuse:
        raise OptionsError(
            "the inplace variant is a fused graph (onnxruntime's "
            "DecoderMaskedMultiHeadAttention); drop --no-fuse or the inplace variant"
        )
    start = time.perf_counter()
    vocabulary = fingerprints(tokenizers)  # in every graph's metadata_props and the manifest
    metadata = graph_metadata(vocabulary)
    say("export encoder" + (" (fused attention)" if fuse else ""))
    encoder = export_encoder(model, directory / C.ENCODER_FILE, opset, fuse, metadata)
    say(f"  {C.ENCODER_FILE}: {encoder.bytes / 1e6:.2f} MB in {encoder.seconds:.1f} s")
    say("export decoder")
    decoder = export_decoder(model, directory / C.DECODER_FILE, opset, fuse, metadata)
    say(f"  {C.DECODER_FILE}: {decoder.bytes / 1e6:.2f} MB in {decoder.seconds:.1f} s")
    if (encoder.opset, encoder.ir_version) != (decoder.opset, decoder.ir_version):
        raise BundleError("encoder and decoder were exported with different opsets")
    say(f"check: onnx checker (full) passed, opset {encoder.opset}, IR {encoder.ir_version}")
    parity: dict[str, Any] = {"skipped": True}
    if verify:
        engine = open_engine(encoder.path, decoder.path, model.cfg)
        if held is None:
            held = HeldOut(random_sources(model, LEVEL3_MIN_INPUTS), None, "random sources")
        parity = run_parity(
            model,
            engine,
            held.sources,
            source_description=held.description,
            texts=held.texts,
            max_new_tokens=max_new_tokens,
            progress=say,
        )
        check_parity(parity)
        if reference is not None:
            say(f"parity against the source model on {len(held.sources)} inputs")
            parity["source"] = source_parity(reference, engine, held, model.cfg, max_new_tokens)
            parity["passed"] = parity["passed"] and parity["source"]["passed"]
            group = parity["source"]
            say(f"  source: {'passed' if group['passed'] else 'FAILED'} ({group['seconds']} s)")
            check_source_parity(parity)
    table = build_variants(
        directory,
        model.cfg,
        tokenizers,
        held if verify else None,
        variants,
        fp32_verified=verify,
        max_new_tokens=max_new_tokens,
        progress=say,
    )
    steps = None
    if STEPS_VARIANT in variants.names:
        say("variant steps: a decoder for step batching (rows at different positions)")
        steps, group = build_steps_variant(
            directory, model, table, sources=held.sources if verify and held else None,
            opset=opset, fuse=fuse, metadata=metadata, progress=say,
        )  # fmt: skip
        if group is not None:
            parity["steps"] = group
            parity["passed"] = parity["passed"] and group["passed"]
            check_steps_parity(parity)
    in_place = None
    if IN_PLACE_VARIANT in variants.names:
        say("variant inplace: a decoder whose cache is written in place (beam search)")
        in_place, group = build_in_place_variant(
            directory, model, table, sources=held.sources if verify and held else None,
            opset=opset, metadata=metadata, max_new_tokens=max_new_tokens, progress=say,
        )  # fmt: skip
        if group is not None:
            parity["inplace"] = group
            parity["passed"] = parity["passed"] and group["passed"]
            check_in_place_parity(parity)
    search = None
    if SEARCH_VARIANT in variants.names:
        say("variant search: one BeamSearch graph per precision")
        search, group = build_search_variant(
            directory, model.cfg, tokenizers, table, held if verify else None, max_new_tokens, say
        )
        if group is not None:
            parity["search"] = group
            parity["passed"] = parity["passed"] and group["passed"]
            check_search_parity(parity)
    say("write config, tokenizers, manifest")
    tokenizer_files = tokenizers.save(directory, model.cfg.max_len)
    graphs = {"encoder": encoder, "decoder": decoder}
    write_json(directory / C.CONFIG_FILE, bundle_config(model.cfg, tokenizer_files, graphs, task))
    min_ort = min_onnxruntime(
        encoder.opset, encoder.ir_version, fused=fuse, search=search is not None
    )
    extra: dict[str, Any] = {MANIFEST_KEY: vocabulary}
    extra |= {"search": search} if search is not None else {}
    extra |= {"steps": steps} if steps is not None else {}
    extra |= {"inplace": in_place} if in_place is not None else {}
    return write_manifest(
        directory, bundle_manifest(graphs, start, table, parity, min_ort, **extra)
    )
