"""Export a model to a bundle, or re-verify a bundle against the model it came from.

    manifest = export_checkpoint("runs/rev/best", "bundles/rev", variants=VariantOptions(...))
    report = verify_bundle("bundles/rev", "runs/rev/best")

The library behind `edgeseq export` and `edgeseq verify` (export/cli.py parses options and
prints), as a recipe: a source adapter loads the model (export/sources/), the held-out
inputs are picked (its task's, else random), and the module of the model's kind
(export/kinds/) exports, proves parity, builds the variants and writes the bundle. Both take
a `progress` callback for their lines.
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

from .bundle import refuse_existing
from .heldout import HeldOut, heldout_from_file, heldout_sources
from .kinds import kind_module
from .limits import LEVEL3_MIN_INPUTS
from .sources import SourceError, SourceModel, open_source
from .variants import VariantOptions

Progress = Callable[[str], None]


def _load(path: str | Path, say: Progress, adapter: str | None = None) -> SourceModel:
    """The model at `path` through its source adapter (export/sources/), with a summary line."""
    start = time.perf_counter()
    source = open_source(path, adapter)
    cfg = source.model.cfg
    params = sum(p.numel() for p in source.model.parameters())
    say(
        f"load {path}: d_model {cfg.d_model}, {cfg.n_heads} heads, "
        f"{_layers(cfg)} layers, vocab "
        f"{cfg.src_vocab_size}/{cfg.tgt_vocab_size}, {params / 1e6:.2f} M params "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return source


def _layers(cfg: Any) -> str:
    """ "3+3" for an encoder–decoder, "2 decoder-only" / "2 encoder-only" for GPT / BERT."""
    if cfg.architecture == C.DECODER_ONLY:
        return f"{cfg.n_decoder_layers} decoder-only"
    if cfg.architecture == C.ENCODER_ONLY:
        return f"{cfg.n_encoder_layers} encoder-only"
    return f"{cfg.n_encoder_layers}+{cfg.n_decoder_layers}"


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    force: bool = False,
    progress: Progress | None = None,
    source: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Export the model at `checkpoint` (read by the `source` adapter, default: the one that
    recognises the path; export/sources/) to a bundle at `out`; return the manifest.
    `options` are `export_source`'s (opset, verify, inputs, variants, fuse)."""
    say = progress or (lambda _: None)
    refuse_existing(out, force)  # before the slow steps
    check_writable(out)
    loaded = _load(checkpoint, say, source)
    return export_source(loaded, out, force=force, progress=say, **options)


def export_source(
    source: SourceModel,
    out: str | Path,
    *,
    opset: int | None = None,
    force: bool = False,
    verify: bool = True,
    inputs: int = LEVEL3_MIN_INPUTS,
    variants: VariantOptions | None = None,
    progress: Progress | None = None,
    fuse: bool = True,
    data: str | Path | None = None,
) -> dict[str, Any]:
    """Export a loaded `source` to a bundle at `out` with its kind's module (export/kinds/):
    the steps after the adapter, which never ask where the model came from. `variants`
    (default fp32 only) are each gated on the same held-out inputs (`inputs` of them);
    `fuse=False` exports graphs of standard ONNX operators only (see `export_bundle`).
    `data`: a file of held-out inputs (export/heldout.py) instead of the task's dev split
    (or random ids when the source has no task)."""
    say = progress or (lambda _: None)
    model, tokenizers = source.model, source.tokenizers
    held = _held_out(source, inputs, data) if verify else None
    if held is not None and held.warning:
        say(f"warning: {held.warning}")
    options: dict[str, Any] = {}
    if model.cfg.architecture == C.ENCODER_DECODER:
        options = {"fuse": fuse, "reference": source.reference}
    elif source.reference is not None:
        raise SourceError(
            f"{source.description}: parity against the source model is built for "
            "encoder-decoder models only; import a decoder-only or encoder-only model later"
        )
    return kind_module(model.cfg.architecture).export(
        model, tokenizers, out, task=source.task, held=held, opset=opset, force=force,
        verify=verify, variants=variants, progress=say, **options,
    )  # fmt: skip


def _held_out(source: SourceModel, inputs: int, data: str | Path | None) -> HeldOut:
    if data is not None:
        return heldout_from_file(data, source.tokenizers, source.model, inputs)
    return heldout_sources(source.task, source.tokenizers, source.model, inputs)


def verify_bundle(
    bundle: str | Path,
    checkpoint: str | Path,
    *,
    inputs: int = LEVEL3_MIN_INPUTS,
    progress: Progress | None = None,
    source: str | None = None,
    data: str | Path | None = None,
) -> dict[str, Any]:
    """Re-run parity levels 1-3 of `bundle` against the model at `checkpoint` (read by the
    `source` adapter), and the search variant's group when the bundle has one; return the
    report.

    Raises BundleError for a tampered bundle or one exported from another model, and
    ParityError (carrying the report) when a level fails."""
    say = progress or (lambda _: None)
    loaded = load_bundle(bundle)  # the runtime's checks: manifest, checksums, config, vocabularies
    bundle, manifest, bundle_cfg = loaded.path, loaded.manifest, loaded.config
    say(f"checksums of {len(manifest['files'])} files match {C.MANIFEST_FILE}")
    loaded_source = _load(checkpoint, say, source)
    model, tokenizers = loaded_source.model, loaded_source.tokenizers
    if bundle_cfg != model.cfg:
        raise BundleError(
            f"{bundle} was exported from a model with another config than {checkpoint}; "
            "pass the checkpoint it was exported from"
        )
    held = _held_out(loaded_source, inputs, data)
    if held.warning:
        say(f"warning: {held.warning}")
    kind = kind_module(model.cfg.architecture)
    extra = {"reference": loaded_source.reference} if loaded_source.reference else {}
    return kind.verify(bundle, manifest, model, tokenizers, held, say, **extra)
