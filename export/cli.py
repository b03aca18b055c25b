"""`edgeseq export` and `edgeseq verify`: click parsing over `export_checkpoint` / `verify_bundle`.

    edgeseq export runs/rev/best --out bundles/rev            # graphs + parity + manifest
    edgeseq export runs/rev/best --out bundles/rev --variants fp32,int8,fp16,ort
    edgeseq verify bundles/rev --checkpoint runs/rev/best     # re-run the three parity levels

The library functions take plain arguments and a `progress` callback; the commands only
parse options and print.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgeseq.runtime import constants as C
from edgeseq.runtime.cli_bundle import format_attempts, format_parity, format_variants
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import BundleError, ParityError
from edgeseq.runtime.manifest import check_files, read_manifest
from edgeseq.runtime.progress import progress_bar

from .bundle import export_bundle, refuse_existing
from .heldout import heldout_sources
from .variants import DEFAULT_MAX_METRIC_DROP, GateError, VariantOptions, parse_variants
from .verify import LEVEL3_MIN_INPUTS, check_parity, open_engine, run_parity

Progress = Callable[[str], None]


def _load(checkpoint: str | Path, say: Progress) -> tuple[Any, Any, Any]:
    from edgeseq.build_model.checkpoint import load_checkpoint

    start = time.perf_counter()
    model, tokenizers, meta = load_checkpoint(checkpoint)
    cfg = model.cfg
    params = sum(p.numel() for p in model.parameters())
    say(
        f"load {checkpoint}: d_model {cfg.d_model}, {cfg.n_heads} heads, "
        f"{cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, vocab "
        f"{cfg.src_vocab_size}/{cfg.tgt_vocab_size}, {params / 1e6:.2f} M params "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return model, tokenizers, meta


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
) -> dict[str, Any]:
    """Export a checkpoint directory to a bundle at `out` with the `variants` (default fp32
    only), each non-fp32 one gated on the same held-out inputs; return the manifest."""
    say = progress or (lambda _: None)
    refuse_existing(out, force)  # before the slow steps
    model, tokenizers, meta = _load(checkpoint, say)
    held = heldout_sources(meta.task, tokenizers, model, inputs) if verify else None
    if held is not None and held.warning:
        say(f"warning: {held.warning}")
    return export_bundle(
        model,
        tokenizers,
        out,
        task=meta.task,
        sources=held.sources if held else None,
        texts=held.texts if held else None,
        source_description=held.description if held else None,
        references=held.references if held else None,
        target_chars=held.target_chars if held else False,
        opset=opset,
        force=force,
        verify=verify,
        variants=variants,
        progress=say,
    )


def verify_bundle(
    bundle: str | Path,
    checkpoint: str | Path,
    *,
    inputs: int = LEVEL3_MIN_INPUTS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Re-run parity levels 1-3 of `bundle` against `checkpoint`; return the report.

    Raises BundleError for a tampered bundle or one exported from another model, and
    ParityError (carrying the report) when a level fails."""
    say = progress or (lambda _: None)
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    check_files(bundle, manifest)
    say(f"checksums of {len(manifest['files'])} files match {C.MANIFEST_FILE}")
    config = json.loads((bundle / C.CONFIG_FILE).read_text(encoding="utf-8"))
    bundle_cfg = ModelConfig.from_dict(config["model"])
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
    return report


def _summary(manifest: dict[str, Any], seconds: float) -> str:
    graphs = manifest["graphs"]
    lines = [
        f"opset {manifest['opset']}, IR {manifest['ir_version']}, "
        f"needs onnxruntime >= {manifest['min_onnxruntime']}",
        *(
            f"{name}: {info['bytes'] / 1e6:.2f} MB, exported in {info['export_seconds']:.1f} s"
            for name, info in graphs.items()
        ),
    ]
    parity = manifest["parity"]
    if parity.get("skipped"):
        lines.append("parity: skipped (--no-verify); the manifest records verified: false")
    else:
        lines.append(format_parity(parity))
    lines.append(format_variants(manifest))
    lines.append(f"total {seconds:.1f} s")
    return "\n".join(lines)


@click.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Bundle directory.")
@click.option("--opset", type=int, default=None, help="ONNX opset (default: the exporter's).")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --out.")
@click.option("--no-verify", "no_verify", is_flag=True, help="Skip the parity checks.")
@click.option(
    "--inputs",
    type=click.IntRange(1),
    default=LEVEL3_MIN_INPUTS,
    show_default=True,
    help="Held-out inputs for parity level 3 and the variants' accuracy gates.",
)
@click.option(
    "--variants",
    "variant_names",
    default="fp32",
    show_default=True,
    help="Comma-separated graph variants: fp32 (always), int8, fp16, ort.",
)
@click.option(
    "--max-metric-drop",
    type=float,
    default=DEFAULT_MAX_METRIC_DROP,
    show_default=True,
    help="Gate: largest drop of the task metric vs fp32, in percentage points.",
)
@click.option(
    "--quantize-all",
    is_flag=True,
    help="int8: also quantize the output projection and the embeddings.",
)
def export(
    checkpoint: Path,
    out: Path,
    opset: int | None,
    force: bool,
    no_verify: bool,
    inputs: int,
    variant_names: str,
    max_metric_drop: float,
    quantize_all: bool,
) -> None:
    """Export CHECKPOINT to an ONNX bundle at --out, with parity evidence in its manifest."""
    start = time.perf_counter()
    options = VariantOptions(parse_variants(variant_names), max_metric_drop, quantize_all)
    # On a terminal, a bar on stderr names the running step and counts steps and seconds;
    # the timestamped step lines go to stdout either way.
    with progress_bar(None, "step", "export", disable=sys.stdout.isatty()) as bar:

        def say(text: str) -> None:
            click.echo(f"[{time.perf_counter() - start:5.1f}s] {text}")
            if not text.startswith(" "):
                bar.set_description_str(f"export: {text[:40]}")
                bar.update(1)

        try:
            manifest = export_checkpoint(
                checkpoint,
                out,
                opset=opset,
                force=force,
                verify=not no_verify,
                inputs=inputs,
                variants=options,
                progress=say,
            )
        except GateError as exc:
            click.echo(format_attempts(exc.attempts))
            raise
        except ParityError as exc:
            click.echo(format_parity(exc.report))
            raise
    click.echo(_summary(manifest, time.perf_counter() - start))


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--checkpoint",
    required=True,
    type=click.Path(path_type=Path),
    help="The checkpoint the bundle was exported from.",
)
@click.option(
    "--inputs",
    type=click.IntRange(1),
    default=LEVEL3_MIN_INPUTS,
    show_default=True,
    help="Held-out inputs for parity level 3.",
)
def verify(bundle: Path, checkpoint: Path, inputs: int) -> None:
    """Re-run the parity checks of BUNDLE against the PyTorch CHECKPOINT."""
    start = time.perf_counter()
    say = lambda text: click.echo(f"[{time.perf_counter() - start:5.1f}s] {text}")  # noqa: E731
    try:
        report = verify_bundle(bundle, checkpoint, inputs=inputs, progress=say)
    except ParityError as exc:
        click.echo(format_parity(exc.report))
        raise
    click.echo(format_parity(report))
