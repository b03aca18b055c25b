"""Export a model to a bundle, or re-verify a bundle against the model it came from.

    manifest = export_checkpoint("runs/rev/best", "bundles/rev", ExportOptions(...))
    report = verify_bundle("bundles/rev", "runs/rev/best", ExportOptions(inputs=200))

The library behind `edgeseq export` and `edgeseq verify` (cli/export.py and cli/verify.py
parse options and print), as a recipe: a source adapter loads the model (export/sources/) and
the module of the model's kind (export/kinds/, one interface for every kind) picks the
held-out inputs, exports, proves parity, builds the variants and writes the bundle, or
re-runs the parity groups of a bundle. `ExportOptions.progress` receives their progress lines.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeseq.runtime import constants as C
from edgeseq.runtime.atomic import check_writable
from edgeseq.runtime.bundle import load_bundle
from edgeseq.runtime.errors import BundleError, OptionsError

from .bundle import refuse_existing
from .external_data import external_data_threshold
from .kinds import kind_module
from .options import ExportOptions
from .sources import SourceModel, open_source

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
    if source.generation is not None:  # export/sources/generation_config.py
        if source.generation.settings:
            say(f"generation defaults: {json.dumps(source.generation.settings, sort_keys=True)}")
        for line in source.generation.ignored:
            say(line)
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
    options: ExportOptions | None = None,
    *,
    source: str | None = None,
) -> dict[str, Any]:
    """Export the model at `checkpoint` (read by the `source` adapter, default: the one that
    recognises the path; export/sources/) to a bundle at `out`; return the manifest."""
    options = options or ExportOptions()
    refuse_existing(out, options.force)  # before the slow steps
    check_writable(out)
    external_data_threshold()  # a bad EDGESEQ_EXTERNAL_DATA_MB, too
    loaded = _load(checkpoint, options.say, source)
    return export_source(loaded, out, options)


def export_source(
    source: SourceModel, out: str | Path, options: ExportOptions | None = None
) -> dict[str, Any]:
    """Export a loaded `source` to a bundle at `out` with its kind's module (export/kinds/):
    the steps after the adapter, which never ask where the model came from."""
    options = options or ExportOptions()
    refuse_search_with_languages(source, options)
    if options.target_lang is not None:
        source = with_default_target(source, options.target_lang)
    kind = kind_module(source.model.cfg.architecture)
    return kind.export(source, out, options)


def refuse_search_with_languages(source: SourceModel, options: ExportOptions) -> None:
    """OptionsError when `options` ask for the one-graph search variant of a model with a
    language list (m2m_100 / NLLB, mBART-50): every output starts with a forced target language,
    which only the Python loop forces (runtime/graph_search.py), so the graph would never run."""
    if source.languages is not None and "search" in options.variants.names:
        raise OptionsError(
            f"--variants search: {source.adapter} models start every output with a forced target "
            "language, which the one-graph search cannot force; leave search out of --variants "
            "(generate runs the Python loop)"
        )


def with_default_target(source: SourceModel, code: str) -> SourceModel:
    """`source` with `code` as its default target language (`export --target-lang`): the bundle
    records it, and parity forces it as the source model's own generate does; OptionsError
    for a code the model does not have (with the list) or a model without a language list."""
    if source.languages is None:
        raise OptionsError(
            f"--target-lang {code}: {source.adapter} models have no language list; drop it"
        )
    codes = source.languages["codes"]
    if code not in codes:
        raise OptionsError(f"--target-lang {code!r} is not one of this model's: {', '.join(codes)}")
    reference = source.reference
    if reference is not None and getattr(reference, "target_prefix", ()):
        reference = copy.copy(reference)
        reference.target_prefix = (codes[code],)  # type: ignore[attr-defined]
    languages = {**source.languages, "default_target": code}
    return replace(source, languages=languages, reference=reference)


def verify_bundle(
    bundle: str | Path,
    checkpoint: str | Path,
    options: ExportOptions | None = None,
    *,
    source: str | None = None,
) -> dict[str, Any]:
    """Re-run every parity group `bundle`'s manifest lists (levels 1-3, the source model's,
    each graph variant's) against the model at `checkpoint` (read by the `source` adapter)
    on `options`' held-out inputs; return the report.

    Raises BundleError for a tampered bundle or one exported from another model, and
    ParityError (carrying the report) when a group fails."""
    options = options or ExportOptions()
    loaded = load_bundle(bundle)  # the runtime's checks: manifest, checksums, config, vocabularies
    options.say(f"checksums of {len(loaded.manifest['files'])} files match {C.MANIFEST_FILE}")
    loaded_source = _load(checkpoint, options.say, source)
    if loaded.config != loaded_source.model.cfg:
        raise BundleError(
            f"{loaded.path} was exported from a model with another config than {checkpoint}; "
            "pass the checkpoint it was exported from"
        )
    target = loaded.languages.default_target if loaded.languages is not None else None
    if target is not None and target != (loaded_source.languages or {}).get("default_target"):
        loaded_source = with_default_target(loaded_source, target)  # export --target-lang's
    return kind_module(loaded.config.architecture).verify(loaded, loaded_source, options)
