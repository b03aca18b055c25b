"""`edgeseq inspect BUNDLE`: a bundle's manifest, model, files, graphs and the parity and
gate evidence measured at export, then the checks that loading it runs.

    edgeseq inspect bundles/g2p-en          # or a built-in name: edgeseq inspect g2p-en

Torch-free: the runtime reads and checks the bundle, export/report.py formats the evidence.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import click
import onnxruntime as ort

from edgeseq.export.report import format_parity, format_table, format_variants
from edgeseq.runtime import constants as C
from edgeseq.runtime.builtin import resolve_bundle
from edgeseq.runtime.bundle import check_graph_pair, check_model_graph, load_bundle
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.external_data import data_file_name
from edgeseq.runtime.graph_variants import GRAPH_VARIANTS, open_graph_variant
from edgeseq.runtime.manifest import check_inside, file_status, read_manifest
from edgeseq.runtime.providers import create_session

NUMPY_NAMES = {"float": "float32", "double": "float64"}  # onnxruntime type names -> numpy's


def _session(path: Path) -> ort.InferenceSession:
    """A quiet CPU session of the graph at `path`; BundleError when onnxruntime refuses it."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return create_session(path, ["CPUExecutionProvider"], options)


def _graph_io(path: Path) -> list[tuple[str, ...]]:
    """(direction, name, dtype, shape) rows of a graph, read through an onnxruntime session."""
    session = _session(path)
    rows: list[tuple[str, ...]] = []
    for direction, values in (("in", session.get_inputs()), ("out", session.get_outputs())):
        for value in values:
            dtype = value.type.removeprefix("tensor(").removesuffix(")")
            dtype = NUMPY_NAMES.get(dtype, dtype)
            shape = "[" + ", ".join(str(d) for d in value.shape) + "]"
            rows.append((direction, value.name, dtype, shape))
    return _fold_layers(rows)


def _fold_layers(rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Consecutive per-layer rows alike fold into one: `past_k.0` .. `past_k.6` with the same
    dtype and shape -> `past_k.{0..6}`."""

    def key(row: tuple[str, ...]) -> tuple[str, ...]:
        family, _, layer = row[1].partition(".")
        return (row[0], family if layer.isdigit() else row[1], row[2], row[3])

    folded = []
    for (direction, name, dtype, shape), group in itertools.groupby(rows, key):
        layers = [row[1].partition(".")[2] for row in group]
        if len(layers) > 1:
            name = f"{name}.{{{layers[0]}..{layers[-1]}}}"
        elif layers[0].isdigit():
            name = f"{name}.{layers[0]}"
        folded.append((direction, name, dtype, shape))
    return folded


def _id(special: dict[str, Any]) -> int:
    return int(special["id"])


def _model_line(model: dict[str, Any]) -> str:
    d_head = model["d_model"] // model["n_heads"]
    architecture = model.get("architecture", "encoder-decoder")
    if architecture == "decoder-only":
        layers, vocab = f"GPT, {model['n_decoder_layers']} layers", model["tgt_vocab_size"]
    elif architecture == "encoder-only":
        layers = f"BERT, {model['n_encoder_layers']} layers"
        vocab = f"{model['src_vocab_size']}, {model['tgt_vocab_size']} labels"
    else:
        layers = f"{model['n_encoder_layers']}+{model['n_decoder_layers']} layers"
        vocab = f"{model['src_vocab_size']} -> {model['tgt_vocab_size']}"
    return (
        f"model: d_model {model['d_model']}, {model['n_heads']} heads (d_head {d_head}), "
        f"{layers}, d_ff {model['d_ff']}, vocab {vocab}, "
        f"max_len {model['max_len']}, {model['norm']}-norm, {model['positional']} positions, "
        f"{model['activation']}, {'tied' if model['tie_output'] else 'separate'} output"
    )


def inspect_bundle(path: str | Path) -> tuple[str, list[str]]:
    """The inspection text of bundle `path` (a directory or a built-in name) and the names
    of files failing their checksum."""
    path = resolve_bundle(path)
    manifest = read_manifest(path)
    lines = [
        f"bundle {path} (format {manifest['format_version']}, edgeseq "
        f"{manifest.get('edgeseq_version', '?')}, created {manifest.get('created_utc', '?')})"
    ]
    try:
        config = json.loads((path / C.CONFIG_FILE).read_text(encoding="utf-8"))
        lines.append(_model_line(config["model"]))
        specials = config.get("special_tokens", {})
        lines.append(
            "special tokens: "
            + ", ".join(f"{s['token']}={s['id']}" for s in sorted(specials.values(), key=_id))
        )
        if config.get("task"):
            lines.append(f"task: {json.dumps(config['task'], sort_keys=True)}")
        if config.get("generation"):  # the source's settings: generate's defaults
            lines.append(f"generation defaults: {json.dumps(config['generation'], sort_keys=True)}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as exc:
        lines.append(f"model: {C.CONFIG_FILE} cannot be shown ({type(exc).__name__}: {exc})")
    exporter = ", ".join(f"{k} {v}" for k, v in sorted(manifest.get("exporter", {}).items()))
    lines.append(
        f"graphs: opset {manifest.get('opset')}, IR {manifest.get('ir_version')}, needs "
        f"onnxruntime >= {manifest.get('min_onnxruntime')}; exported with {exporter}"
    )
    bad: list[str] = []
    rows = [("file", "bytes", "sha256", "check")]
    for name, entry in sorted(manifest.get("files", {}).items()):
        if not isinstance(entry, dict):
            bad.append(name)
            rows.append((name, "?", "?", "not a file entry"))
            continue
        status = file_status(path, name, entry)
        if status != "ok":
            bad.append(name)
        rows.append((name, f"{entry.get('bytes', 0):,}", entry.get("sha256", "")[:16], status))
    lines += ["files:", format_table(rows, "  ")]
    for variant, info in manifest.get("variants", {}).items():
        info = info if isinstance(info, dict) else {}
        notes = ["verified" if info.get("verified") else "not verified"]
        quantization = info.get("quantization")
        if isinstance(quantization, dict) and "reduce_range" in quantization:
            notes.append(f"{7 if quantization['reduce_range'] else 8}-bit weights")
        lines.append(f"variant {variant} ({', '.join(notes)}):")
        for graph in ("encoder", "decoder", "model"):  # "model": a GPT or BERT bundle
            name = info.get(graph)
            if isinstance(name, str) and name not in bad and (path / name).is_file():
                check_inside(path, name)
                data = data_file_name(name)
                weights = f" (weights in {data})" if data in manifest.get("files", {}) else ""
                lines.append(f"  {name}{weights}")
                lines.append(format_table(_graph_io(path / name), "    "))
    for key, variant in GRAPH_VARIANTS.items():  # the extra graphs: runtime/graph_variants.py
        entry = manifest.get(key)
        listed = [p for p in variant.files if isinstance(entry, dict) and p in entry]
        if listed:
            lines.append(f"{key}: {variant.title} ({', '.join(listed)})")
    lines += ["parity (measured at export):", format_parity(manifest.get("parity", {}))]
    lines += ["variants (measured at export):", format_variants(manifest)]
    return "\n".join(lines), bad


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
def inspect(bundle: Path) -> None:
    """Print BUNDLE's manifest, graphs (inputs, outputs, shapes), files and parity report,
    then run the checks that loading it runs (exit 1 when one fails)."""
    text, bad = inspect_bundle(bundle)
    click.echo(text)
    if bad:
        raise BundleError(
            f"{', '.join(bad)} in {bundle} {'does' if len(bad) == 1 else 'do'} not match the "
            "manifest (tampered or corrupted); "
            "re-export or copy the bundle again"
        )
    check_bundle(bundle)
    click.echo("check: ok (every check that loading the bundle runs)")


def check_bundle(path: str | Path) -> None:
    """The checks of `Generator.load`, for every graph variant: `load_bundle` (manifest,
    checksums, config, tokenizers) and `check_graph_pair` (graphs against config.json; a
    GPT or BERT bundle's one graph: `check_model_graph`), and every extra graph opened
    (`open_graph_variant`). A BundleError says which failed."""
    bundle = load_bundle(path)
    for variant, files in bundle.variants.items():
        if len(files) == 1:
            check_model_graph(bundle, _session(files[0]), variant)
        else:
            check_graph_pair(bundle, _session(files[0]), _session(files[1]), variant)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for key, precisions in bundle.graph_variants.items():
        for precision in precisions:
            open_graph_variant(bundle, key, precision, ["CPUExecutionProvider"], options)
