"""Write an encoder–decoder bundle: both graphs, their parity, the precision variants behind
their gates, the extra graphs of the registry, config.json, tokenizers and manifest.json.

    manifest = write_bundle(model, tokenizers, "bundles/rev", ExportOptions(), task=task,
                            held=held)                                   # held: export/heldout.py
    manifest = export_bundle(model, tokenizers, "bundles/rev", variants=VariantOptions(...))

The recipe is export encoder -> export decoder -> check -> parity (levels 1-3, and against
the source model for an import) -> precision variants (precisions.py) -> graph variants
(graph_variants.py: each written, then its parity group) -> write. Every file is written
into a hidden temporary sibling of the target (runtime/atomic.py) that is renamed into place
only when everything succeeded, so an exception, a failed parity check or Ctrl-C leaves
neither a partial bundle nor the temporary directory. An existing target is replaced only
with `force`. The format is documented in docs/bundle.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime import constants as C
from edgeseq.runtime.atomic import atomic_directory
from edgeseq.runtime.errors import BundleError, OptionsError
from edgeseq.runtime.manifest import write_manifest
from edgeseq.runtime.tokenizer import TokenizerPair
from edgeseq.runtime.vocabulary import MANIFEST_KEY, fingerprints, graph_metadata

from ...bundle import (
    OutputExistsError,
    bundle_config,
    bundle_manifest,
    min_onnxruntime,
    refuse_existing,
    write_json,
)
from ...external_data import refuse_unsupported_variants
from ...heap import release_free_heap
from ...heldout import HeldOut, with_languages
from ...limits import LEVEL3_MIN_INPUTS
from ...onnx_export import GraphInfo
from ...options import ExportOptions, Progress
from ...parity import add_group, check_group, check_parity, random_sources
from ...shared_weights import adopt_equal_tensors
from ...sources import SourceReference
from ...variants import VariantOptions
from .float64_noise import ModelNoise
from .graph_variants import VARIANT_EXPORTS, VariantContext, requested
from .graphs import export_decoder, export_encoder
from .parity import open_engine, run_parity
from .precisions import build_variants
from .source_parity import source_failure, source_parity
from .top_parity import top_failure, top_parity


def export_bundle(
    model: Seq2SeqTransformer,
    tokenizers: TokenizerPair,
    out: str | Path,
    *,
    task: dict[str, Any] | None = None,
    held: HeldOut | None = None,
    reference: SourceReference | None = None,
    opset: int | None = None,
    force: bool = False,
    verify: bool = True,
    max_new_tokens: int | None = None,
    variants: VariantOptions | None = None,
    progress: Progress | None = None,
    fuse: bool = True,
) -> dict[str, Any]:
    """`write_bundle` with the options as keywords (see `ExportOptions`): export `model` to a
    bundle directory `out` and return its manifest."""
    options = ExportOptions(
        opset=opset, force=force, verify=verify, variants=variants or VariantOptions(),
        fuse=fuse, max_new_tokens=max_new_tokens, progress=progress,
    )  # fmt: skip
    return write_bundle(model, tokenizers, out, options, task=task, held=held, reference=reference)


def write_bundle(
    model: Seq2SeqTransformer,
    tokenizers: TokenizerPair,
    out: str | Path,
    options: ExportOptions,
    *,
    task: dict[str, Any] | None = None,
    held: HeldOut | None = None,
    reference: SourceReference | None = None,
    languages: dict[str, Any] | None = None,
    generation: dict[str, Any] | None = None,
    task_prefixes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Export `model` to a bundle directory `out` and return its manifest.

    `held` holds the held-out sources (id lists ending with `</s>`) for parity level 3, their
    texts for the report and, from a task, the references that give the variants' accuracy
    gates a task metric (export/heldout.py); without `held` LEVEL3_MIN_INPUTS random sources
    are used and the gates measure agreement with fp32 only. With `options.verify`, a parity
    failure raises `ParityError`, a variant missing its gate `GateError`, and nothing is
    written. `options.fuse` exports the graphs with fused attention (`com.microsoft`
    `MultiHeadAttention`, fused projections); without it, standard ONNX operators only.
    `reference`, the model an import adapter mapped (export/sources/), adds the parity group
    against it (source_parity.py): the bundle must reproduce the original, not only `model`.
    `languages`, a multilingual import's language list, and `generation`, the source's
    generation settings (export/sources/generation_config.py), and `task_prefixes`, the text
    each named task puts before an input (T5's task_specific_params), go into config.json."""
    out = Path(out)
    refuse_existing(out, options.force)
    extras = requested(options.variants.names)
    unfused = [v.key for v in extras if v.needs_fuse and not options.fuse]
    if unfused:
        raise OptionsError(
            f"the {', '.join(unfused)} variant is a fused graph (onnxruntime's "
            "DecoderMaskedMultiHeadAttention); drop --no-fuse or the "
            f"{', '.join(unfused)} variant"
        )
    if options.verify and held is None:
        held = HeldOut(random_sources(model, LEVEL3_MIN_INPUTS), None, "random sources")
        held = with_languages(held, languages, tokenizers, model)
    model.eval()
    with atomic_directory(out) as tmp:
        extra = {"languages": languages, "generation": generation, "task_prefixes": task_prefixes}
        manifest = _write_into(tmp, model, tokenizers, options, task, held, reference, **extra)
        if (out.exists() or out.is_symlink()) and not options.force:
            raise OutputExistsError(f"{out} appeared during the export; pass --force to replace it")
    options.say(f"wrote {out}")
    return manifest


def _write_into(
    directory: Path,
    model: Seq2SeqTransformer,
    tokenizers: TokenizerPair,
    options: ExportOptions,
    task: dict[str, Any] | None,
    held: HeldOut | None,
    reference: SourceReference | None,
    languages: dict[str, Any] | None = None,
    generation: dict[str, Any] | None = None,
    task_prefixes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Every step of `write_bundle` inside the (temporary) `directory`."""
    start = time.perf_counter()
    vocabulary = fingerprints(tokenizers)  # in every graph's metadata_props and the manifest
    metadata = graph_metadata(vocabulary)
    graphs = export_graphs(directory, model, options, metadata)
    refuse_unsupported_variants([g.path for g in graphs.values()], options.variants.names)
    held = held if options.verify else None
    parity: dict[str, Any] = {"skipped": True}
    if held is not None:
        parity = prove_graphs(graphs, model, held, reference, options.max_new_tokens, options.say)
    table = build_variants(
        directory, model.cfg, tokenizers, held, options.variants, fp32_verified=options.verify,
        max_new_tokens=options.max_new_tokens, progress=options.say,
    )  # fmt: skip
    context = VariantContext(
        directory, model, tokenizers, table, held, options.max_new_tokens, options.opset,
        options.fuse, metadata, options.say,
    )  # fmt: skip
    entries: dict[str, Any] = {}
    for variant in requested(options.variants.names):
        options.say(variant.announce)
        entries[variant.key] = variant.write(context)
        if held is not None:
            prove_variant(variant.key, variant.precisions(entries[variant.key]), context, parity)
    options.say("write config, tokenizers, manifest")
    tokenizer_files = tokenizers.save(directory, model.cfg.max_len)
    config = bundle_config(
        model.cfg, tokenizer_files, graphs, task, languages=languages, generation=generation,
        task_prefixes=task_prefixes,
    )  # fmt: skip
    write_json(directory / C.CONFIG_FILE, config)
    encoder = graphs["encoder"]
    needs = [C.MIN_ORT_FUSED_ATTENTION] if options.fuse else []
    needs += [m for key in entries if (m := VARIANT_EXPORTS[key].min_onnxruntime)]
    min_ort = min_onnxruntime(encoder.opset, encoder.ir_version, *needs)
    extra = {MANIFEST_KEY: vocabulary, C.MANIFEST_FUSED_ATTENTION: options.fuse, **entries}
    return write_manifest(
        directory, bundle_manifest(graphs, start, table, parity, min_ort, **extra)
    )


def export_graphs(
    directory: Path, model: Seq2SeqTransformer, options: ExportOptions, metadata: dict[str, str]
) -> dict[str, GraphInfo]:
    """Export encoder.onnx and decoder.onnx into `directory` (checked: the same opset and IR)."""
    say, fuse, opset = options.say, options.fuse, options.opset
    say("export encoder" + (" (fused attention)" if fuse else ""))
    encoder = export_encoder(model, directory / C.ENCODER_FILE, opset, fuse, metadata)
    say(f"  {C.ENCODER_FILE}: {encoder.bytes / 1e6:.2f} MB in {encoder.seconds:.1f} s")
    say("export decoder")
    decoder = export_decoder(model, directory / C.DECODER_FILE, opset, fuse, metadata)
    say(f"  {C.DECODER_FILE}: {decoder.bytes / 1e6:.2f} MB in {decoder.seconds:.1f} s")
    if (encoder.opset, encoder.ir_version) != (decoder.opset, decoder.ir_version):
        raise BundleError("encoder and decoder were exported with different opsets")
    say(f"check: onnx checker (full) passed, opset {encoder.opset}, IR {encoder.ir_version}")
    return {"encoder": encoder, "decoder": decoder}


def prove_graphs(
    graphs: dict[str, Path] | dict[str, GraphInfo],
    model: Seq2SeqTransformer,
    held: HeldOut,
    reference: SourceReference | None,
    max_new_tokens: int | None,
    say: Progress,
) -> dict[str, Any]:
    """Parity levels 1-3 of the fp32 encoder and decoder (`graphs`: their paths or export
    infos) against `model`, and the group against the source model when `reference` is
    given; ParityError when one fails."""
    paths = [g.path if isinstance(g, GraphInfo) else g for g in graphs.values()]
    engine = open_engine(paths[0], paths[1], model.cfg)
    parity = run_parity(
        model, engine, held.sources, source_description=held.description, texts=held.texts,
        max_new_tokens=max_new_tokens, progress=say,
    )  # fmt: skip
    check_parity(parity)
    if engine.top_width:
        say(f"parity of the decoder's top-k outputs with its logits on {len(held.sources)} inputs")
        add_group(parity, "top", top_parity(engine, held.sources, max_new_tokens))
        release_free_heap()
        check_group(parity, "top", top_failure)
    if reference is not None:
        say(f"parity against the source model on {len(held.sources)} inputs")
        share_source_weights(model, reference, say)
        drift, noise = parity["level2"]["torch_cached_vs_uncached"], ModelNoise(model, held.sources)
        group = source_parity(reference, engine, held, model.cfg, max_new_tokens, drift, noise)
        add_group(parity, "source", group)
        release_free_heap()
        say(f"  source: {'passed' if group['passed'] else 'FAILED'} ({group['seconds']} s)")
        check_group(parity, "source", source_failure)
    return parity


def share_source_weights(
    model: Seq2SeqTransformer, reference: SourceReference, say: Progress
) -> None:
    """Let `model` read the weights it has in common with the source model (a transformers
    module behind `reference.model`) from the source's tensors (export/shared_weights.py)."""
    source = getattr(reference, "model", None)
    if isinstance(source, torch.nn.Module):
        saved = adopt_equal_tensors(model, source)
        release_free_heap()
        say(f"  {saved / 1e6:,.0f} MB of weights read from the source model's tensors, not copied")


def prove_variant(
    key: str, precisions: list[str], context: VariantContext, report: dict[str, Any]
) -> None:
    """Run graph variant `key`'s parity group for `precisions` into `report`; ParityError
    when it fails."""
    variant = VARIANT_EXPORTS[key]
    add_group(report, key, variant.parity(context, precisions))
    release_free_heap()
    check_group(report, key, variant.failure)
