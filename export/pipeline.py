"""Export a checkpoint directory to a bundle, or re-verify a bundle against its checkpoint.

    manifest = export_checkpoint("runs/rev/best", "bundles/rev", variants=VariantOptions(...))
    report = verify_bundle("bundles/rev", "runs/rev/best")

The library behind `edgeseq export` and `edgeseq verify` (export/cli.py parses options and
prints): load the checkpoint, pick the held-out inputs of its task, and hand both to
`export_bundle` or to the parity levels. Both take a `progress` callback for their lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeseq.runtime import constants as C
from edgeseq.runtime.atomic import check_writable
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.manifest import check_files, read_manifest

from .bundle import export_bundle, refuse_existing
from .heldout import heldout_sources
from .limits import LEVEL3_MIN_INPUTS
from .search_parity import check_search_parity, search_parity_group
from .variants import VariantOptions
from .verify import check_parity, open_engine, run_parity

Progress = Callable[[str], None]


def _load(checkpoint: str | Path, say: Progress) -> tuple[Any, Any, Any]:
    from edgeseq.build_model.checkpoint import load_checkpoint

    start = time.perf_counter()
    model, tokenizers, meta = load_checkpoint(checkpoint)
    cfg = model.cfg
    params = sum(p.numel() for p in model.parameters())
    say(
        f"load {checkpoint}: d_model {cfg.d_model}, {cfg.n_heads} heads, "
        f"{_layers(cfg)} layers, vocab "
        f"{cfg.src_vocab_size}/{cfg.tgt_vocab_size}, {params / 1e6:.2f} M params "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return model, tokenizers, meta


def _layers(cfg: Any) -> str:
    """ "3+3" for an encoder–decoder, "2 decoder-only" / "2 encoder-only" for GPT / BERT."""
    if cfg.architecture == "decoder-only":
        return f"{cfg.n_decoder_layers} decoder-only"
    if cfg.architecture == "encoder-only":
        return f"{cfg.n_encoder_layers} encoder-only"
    return f"{cfg.n_encoder_layers}+{cfg.n_decoder_layers}"


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    opset: int | None = None,
    force: bool = False,
    verify: bool = True,
    inputs: int = LEVEL3_MIN_INPUTS,
    variants: VariantOptions | None = None,
    progress: Progress | None = None,
    fuse: bool = True,
) -> dict[str, Any]:
    """Export a checkpoint directory to a bundle at `out` with the `variants` (default fp32
    only), each non-fp32 one gated on the same held-out inputs; return the manifest.
    `fuse=False` exports graphs of standard ONNX operators only (see `export_bundle`)."""
    say = progress or (lambda _: None)
    refuse_existing(out, force)  # before the slow steps
    check_writable(out)
    model, tokenizers, meta = _load(checkpoint, say)
    held = heldout_sources(meta.task, tokenizers, model, inputs) if verify else None
    if held is not None and held.warning:
        say(f"warning: {held.warning}")
    if model.cfg.architecture != "encoder-decoder":  # GPT or BERT: one graph
        from .lm_bundle import export_lm_bundle

        return export_lm_bundle(
            model, tokenizers, out, task=meta.task, held=held, opset=opset, force=force,
            verify=verify, variants=variants, progress=say,
        )  # fmt: skip
    return export_bundle(
        model,
        tokenizers,
        out,
        task=meta.task,
        held=held,
        opset=opset,
        force=force,
        verify=verify,
        variants=variants,
        progress=say,
        fuse=fuse,
    )


def verify_bundle(
    bundle: str | Path,
    checkpoint: str | Path,
    *,
    inputs: int = LEVEL3_MIN_INPUTS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Re-run parity levels 1-3 of `bundle` against `checkpoint`, and the search variant's
    group when the bundle has one; return the report.

    Raises BundleError for a tampered bundle or one exported from another model, and
    ParityError (carrying the report) when a level fails."""
    say = progress or (lambda _: None)
    manifest = read_manifest(bundle)
    if manifest.get("kind") in ("gpt", "bert"):  # one graph: checksums, then its parity
        from .lm_bundle import verify_lm_bundle

        check_files(bundle, manifest)
        say(f"checksums of {len(manifest['files'])} files match {C.MANIFEST_FILE}")
        model, tokenizers, meta = _load(checkpoint, say)
        held = heldout_sources(meta.task, tokenizers, model, inputs)
        return verify_lm_bundle(Path(bundle), manifest, model, held, say)
    loaded = load_bundle(bundle)  # the runtime's checks: manifest, checksums, config, tokenizers
    bundle, manifest, bundle_cfg = loaded.path, loaded.manifest, loaded.config
    say(f"checksums of {len(manifest['files'])} files match {C.MANIFEST_FILE}")
    model, tokenizers, meta = _load(checkpoint, say)
    if bundle_cfg != model.cfg:
        raise BundleError(
            f"{bundle} was exported from a model with another config than {checkpoint}; "
            "pass the checkpoint it was exported from"
        )
    variant = manifest["variants"]["fp32"]
    engine = open_engine(bundle / variant["encoder"], bundle / variant["decoder"], bundle_cfg)
    held = heldout_sources(meta.task, tokenizers, model, inputs)
    if held.warning:
        say(f"warning: {held.warning}")
    report = run_parity(
        model,
        engine,
        held.sources,
        source_description=held.description,
        texts=held.texts,
        progress=say,
    )
    check_parity(report)
    precisions = [p for p in C.SEARCH_FILES if p in (manifest.get("search") or {})]
    if precisions:  # the one-graph search variant: its parity group again
        group = search_parity_group(
            bundle, bundle_cfg, tokenizers, precisions, held, model.cfg.max_len, say
        )
        report["search"] = group
        report["passed"] = report["passed"] and group["passed"]
        check_search_parity(report)
    return report
