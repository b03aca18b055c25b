"""`edgeseq export`: click parsing over export/pipeline.py.

    edgeseq export runs/rev/best --out bundles/rev            # graphs + parity + manifest
    edgeseq export runs/rev/best --out bundles/rev --variants fp32,int8,fp16,ort

The command only parses options and prints; the library (`export_checkpoint`) is imported
when it runs, so `--help` needs neither torch nor onnx (`edgeseq verify`: cli/verify.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from edgeseq.export.limits import DEFAULT_MAX_METRIC_DROP
from edgeseq.export.report import format_attempts, format_parity, format_variants
from edgeseq.export.sources import ADAPTERS
from edgeseq.runtime.errors import ParityError
from edgeseq.runtime.progress import progress_bar

from .options import data_option, inputs_option


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
@click.argument("checkpoint", metavar="SOURCE", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Bundle directory.")
@click.option(
    "--source",
    "adapter",
    type=click.Choice(["auto", *ADAPTERS]),
    default="auto",
    show_default=True,
    help="What SOURCE is: an edgeseq checkpoint (checkpoint), a torch.nn.Transformer model "
    "described by a torch_source.json (torch), a Hugging Face MarianMT directory (marian), "
    "M2M-100 / NLLB-200 (m2m_100), BART or mBART-50 (mbart), T5 (t5); auto recognises it.",
)
@data_option()
@click.option(
    "--target-lang",
    default=None,
    help="A multilingual model's default target language, recorded in the bundle (default: "
    "the source's tgt_lang or forced_bos_token_id, else none).",
)
@click.option("--opset", type=int, default=None, help="ONNX opset (default: the exporter's).")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --out.")
@click.option("--no-verify", "no_verify", is_flag=True, help="Skip the parity checks.")
@inputs_option("Held-out inputs for parity level 3 and the variants' accuracy gates.")
@click.option(
    "--max-new-tokens",
    type=click.IntRange(1),
    default=None,
    help="Longest output parity level 3 and the gates decode (default: the checkpoint's "
    "generation max_length, else the model's max_len). A model with random weights never ends "
    "an output, so this bounds its parity time.",
)
@click.option(
    "--variants",
    "variant_names",
    default="fp32",
    show_default=True,
    help="Comma-separated graph variants: fp32 (always), int8, fp16, ort, search (the "
    "one-graph BeamSearch variant, for fp32 and for int8 when exported), steps (a decoder "
    "for edgeseq serve's step batching, for each of fp32, int8 and fp16 exported), inplace (a "
    "decoder whose cache is written in place, which beam search on the loop uses; likewise).",
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
    help="int8: also quantize the embeddings (and a GPT/BERT output head, which the default "
    "keeps in fp32; an encoder-decoder's output projection is quantized by default, gated).",
)
@click.option(
    "--int8-weight-bits",
    type=click.Choice(["7", "8"]),
    default="7",
    show_default=True,
    help="int8: bits of the weights. 7 cannot saturate on any x86 CPU; 8 is closer to fp32 but "
    "saturates on x86 CPUs without VNNI (AVX2, AVX-512 without VNNI): export 8 only for "
    "machines with VNNI or ARM64 (docs/export.md, int8).",
)
@click.option(
    "--fuse/--no-fuse",
    default=True,
    show_default=True,
    help="Fused attention (onnxruntime's com.microsoft MultiHeadAttention) in the graphs; "
    "--no-fuse writes standard ONNX operators only.",
)
def export(
    checkpoint: Path,
    out: Path,
    adapter: str,
    data: Path | None,
    target_lang: str | None,
    opset: int | None,
    force: bool,
    no_verify: bool,
    inputs: int,
    max_new_tokens: int | None,
    variant_names: str,
    max_metric_drop: float,
    quantize_all: bool,
    int8_weight_bits: str,
    fuse: bool,
) -> None:
    """Export SOURCE to an ONNX bundle at --out, with parity evidence in its manifest.

    SOURCE is a checkpoint of `edgeseq train`, a torch_source.json describing your own
    torch.nn.Transformer model, or a Hugging Face directory (save_pretrained) of MarianMT,
    M2M-100 / NLLB, BART / mBART-50 or T5; imported models are also checked against the
    original model (docs/import.md)."""
    start = time.perf_counter()
    from edgeseq.export.gate import GateError
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import export_checkpoint
    from edgeseq.export.variants import VariantOptions, parse_variants

    variants = VariantOptions(
        parse_variants(variant_names),
        max_metric_drop,
        quantize_all,
        reduce_range=int8_weight_bits == "7",
    )
    # With stdout redirected and stderr a terminal, a bar on stderr names the running step
    # and counts steps and seconds; the timestamped step lines go to stdout either way.
    with progress_bar(None, "step", "export", disable=sys.stdout.isatty()) as bar:

        def say(text: str) -> None:
            click.echo(f"[{time.perf_counter() - start:5.1f}s] {text}")
            if not text.startswith(" "):
                bar.set_description_str(f"export: {text[:40]}")
                bar.update(1)

        try:
            options = ExportOptions(
                opset=opset, force=force, verify=not no_verify, inputs=inputs,
                max_new_tokens=max_new_tokens, variants=variants, fuse=fuse, data=data,
                progress=say, target_lang=target_lang,
            )  # fmt: skip
            source = None if adapter == "auto" else adapter
            manifest = export_checkpoint(checkpoint, out, options, source=source)
        except GateError as exc:
            click.echo(format_attempts(exc.attempts))
            raise
        except ParityError as exc:
            click.echo(format_parity(exc.report))
            raise
        except MemoryError:
            from edgeseq.export.external_data import GraphSizeError

            raise GraphSizeError(
                f"this machine ran out of memory exporting {checkpoint} (an export holds the "
                "model and a graph's weights several times): export on a machine with more memory"
            ) from None
    click.echo(_summary(manifest, time.perf_counter() - start))
