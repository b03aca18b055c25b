"""`edgeseq inspect BUNDLE`: what a bundle holds, without torch or onnx.

    edgeseq inspect bundles/rev

Prints the manifest summary (versions, opset, minimum onnxruntime), the model config, every
file with its size and checksum status, each graph's inputs and outputs with dtypes and
shapes (read through onnxruntime sessions), the parity report measured at export and the
variants table (size, load time, tokens/s, accuracy gate against fp32).
A file whose sha256 does not match the manifest is listed, then the command fails.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import click
import onnxruntime as ort

from . import constants as C
from .builtin import resolve_bundle
from .bundle import load_bundle
from .errors import BundleError
from .graph_search import search_parity_rows
from .manifest import file_status, read_manifest

VARIANT_ORDER = ("fp32", "int8", "fp16", "ort")  # display order of the variants table
NUMPY_NAMES = {"float": "float32", "double": "float64"}  # onnxruntime type names -> numpy's


def format_table(rows: list[tuple[str, ...]], indent: str = "") -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(indent + line.rstrip() for line in lines)


def format_parity(report: dict[str, Any]) -> str:
    """A short table of a parity report (as the exporter writes it into the manifest)."""
    if report.get("skipped"):
        return "parity not measured (exported with --no-verify)"
    tol = report["tolerance"]
    ok = lambda passed: "ok" if passed else "FAIL"  # noqa: E731
    rows = [("level", "check", "value", "result")]
    level1 = report["level1"]
    for name in C.ENCODER_FAMILIES + C.DECODER_FAMILIES:
        if name in level1["max_abs_diff"]:
            diff = level1["max_abs_diff"][name]
            graph = "encoder" if name in C.ENCODER_FAMILIES else "decoder"
            label = f"{name}.*" if name in C.KV_FAMILIES else name  # every layer's tensor
            check = f"{graph} {label} max|Δ| ({level1[f'{graph}_cases']} shapes)"
            rows.append(("1", check, f"{diff:.1e}", ok(diff <= tol)))
    level2 = report["level2"]
    size = f"{level2['rows']} rows x {level2['steps']} steps"
    if "live_steps" in level2:  # a row's steps end at its </s> (older manifests: all steps)
        size = f"{level2['rows']} rows, {level2['live_steps']} steps to </s>"
    diff = level2["max_abs_diff_cached"]
    rows.append(("2", f"step logits vs cached torch ({size})", f"{diff:.1e}", ok(diff <= tol)))
    diff, bound = level2["max_abs_diff_uncached"], level2.get("uncached_bound", tol)
    rows.append(("2", f"step logits vs uncached torch ({size})", f"{diff:.1e}", ok(diff <= bound)))
    if "torch_cached_vs_uncached" in level2:
        drift = level2["torch_cached_vs_uncached"]
        rows.append(
            (
                "2",
                f"  bound: {tol:.0e} + torch's own cached vs uncached {drift:.1e}",
                f"{bound:.1e}",
                "",
            )
        )
    level3 = report["level3"]
    check = f"identical greedy sequences ({level3.get('source', '?')})"
    greedy_ok = level3["identical"] == level3["inputs"]
    rows.append(("3", check, f"{level3['identical']}/{level3['inputs']}", ok(greedy_ok)))
    beam = level3.get("beam")
    if beam:
        check = f"identical beam-{beam['beam_size']} best hypotheses (first {beam['inputs']})"
        rows.append(("3", check, f"{beam['identical']}/{beam['inputs']}", ok(beam["passed"])))
    rows += search_parity_rows(report.get("search"))
    lines = [format_table(rows)]
    for m in level3.get("mismatches", []):
        text = m.get("source_text", m["source_ids"])
        lines.append(
            f"  input #{m['index']} {text!r}: first differs at step {m['step']}, "
            f"torch top-2 {m['torch_top2']}, onnx top-2 {m['onnx_top2']}"
        )
    verdict = "passed" if report["passed"] else "FAILED"
    lines.append(f"parity {verdict} (fp32 tolerance {tol:.0e}, {report['seconds']} s)")
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _gate_cell(name: str, entry: dict[str, Any]) -> str:
    gate = entry.get("gate")
    if name == "fp32":
        return "reference" if entry.get("verified") else "not verified"
    if not gate:
        return "not verified" if not entry.get("verified") else "-"
    return "ok" if gate.get("passed") else "FAIL"


def _variant_row(
    name: str, entry: dict[str, Any], metric: str | None, base_rate: float | None
) -> tuple[str, ...]:
    """One row of `format_variants`: size, speed, then the gate's numbers."""
    speed = entry.get("speed") or {}
    rate, size = speed.get("tokens_per_second"), entry.get("bytes")
    row: tuple[str, ...] = (
        name,
        entry.get("format", "onnx"),
        f"{size / 1e6:.2f}" if size else "-",
        f"{entry['size_ratio']:.2f}x" if entry.get("size_ratio") else "-",
        f"{1000 * speed['load_seconds']:.0f}" if speed else "-",
        f"{rate:.0f}" if rate else "-",
        f"{rate / base_rate:.2f}x" if rate and base_rate else "-",
    )
    gate = entry.get("gate") or {}
    row += (_percent(gate.get("agreement")),)
    if metric:
        values = "-"
        if gate:
            values = f"{_percent(gate.get('fp32'))} -> {_percent(gate.get('variant'))}"
        elif metric in (entry.get("scores") or {}):  # fp32's own score
            values = _percent(entry["scores"][metric])
        drop = gate.get("drop_points")
        row += (values, "-" if drop is None else f"{drop:.2f}")
    return (*row, _gate_cell(name, entry))


def format_variants(manifest: dict[str, Any]) -> str:
    """The size / speed / accuracy-gate table of a manifest's variants, then one line per
    gate set-up, int8 exclusion search and note (torch-free; `edgeseq export` prints it too)."""
    table = manifest.get("variants") or {}
    order = {name: i for i, name in enumerate(VARIANT_ORDER)}
    variants = dict(sorted(table.items(), key=lambda item: (order.get(item[0], 99), item[0])))
    fp32 = variants.get("fp32") or {}
    gates = [e["gate"] for e in variants.values() if isinstance(e, dict) and e.get("gate")]
    metric = gates[0]["metric"] if gates else fp32.get("metric")
    fp32_speed = fp32.get("speed") or {}
    rows = [("variant", "format", "MB", "size", "load ms", "tokens/s", "speed", "agreement")]
    rows[0] += (f"{metric} fp32->variant", "drop pts", "gate") if metric else ("gate",)
    base_rate = fp32_speed.get("tokens_per_second")
    rows += [_variant_row(name, entry, metric, base_rate) for name, entry in variants.items()]
    lines = [format_table(rows)]
    if gates:
        gate = gates[0]
        lines.append(
            f"gate: greedy on {gate['inputs']} inputs ({gate['source']}) on "
            f"{gate.get('provider', 'CPU')}; fails when {gate['metric']} is more than "
            f"{gate['max_drop_points']} points worse than fp32's"
        )
    if fp32_speed:
        lines.append(
            f"speed: greedy, batch {fp32_speed['batch']}, {fp32_speed['threads']} thread, "
            f"{fp32_speed['inputs']} inputs, fastest of {fp32_speed.get('repeats', 1)} passes "
            "(tokens include </s>)"
        )
    for name, entry in variants.items():
        search = (entry.get("quantization") or {}).get("search")
        if search and len(search) > 1:
            kept = ", ".join(entry["quantization"]["excluded_groups"]) or "none"
            lines.append(f"{name}: gate search tried {len(search)} configurations; fp32: {kept}")
        if entry.get("note"):
            lines.append(f"{name}: {entry['note']}")
    return "\n".join(lines)


def format_attempts(attempts: list[dict[str, Any]]) -> str:
    """The table of a gate search (`GateError.attempts`): what was kept in fp32, and the
    numbers each configuration reached."""
    rows = [("kept in fp32", "agreement", "metric fp32 -> variant", "drop pts", "result")]
    for a in attempts:
        values = f"{a['metric']} {_percent(a['fp32'])} -> {_percent(a['variant'])}"
        rows.append(
            (
                ", ".join(a["excluded_groups"]) or "(nothing)",
                _percent(a["agreement"]),
                values,
                f"{a['drop_points']:.2f}",
                "ok" if a["passed"] else "FAIL",
            )
        )
    return format_table(rows)


def _graph_io(path: Path) -> list[tuple[str, ...]]:
    """(direction, name, dtype, shape) rows of a graph, read through an onnxruntime session."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
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
    return (
        f"model: d_model {model['d_model']}, {model['n_heads']} heads (d_head {d_head}), "
        f"{model['n_encoder_layers']}+{model['n_decoder_layers']} layers, d_ff {model['d_ff']}, "
        f"vocab {model['src_vocab_size']} -> {model['tgt_vocab_size']}, "
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
    config_path = path / C.CONFIG_FILE
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        lines.append(_model_line(config["model"]))
        specials = config.get("special_tokens", {})
        lines.append(
            "special tokens: "
            + ", ".join(f"{s['token']}={s['id']}" for s in sorted(specials.values(), key=_id))
        )
        if config.get("task"):
            lines.append(f"task: {json.dumps(config['task'], sort_keys=True)}")
    exporter = ", ".join(f"{k} {v}" for k, v in sorted(manifest.get("exporter", {}).items()))
    lines.append(
        f"graphs: opset {manifest.get('opset')}, IR {manifest.get('ir_version')}, needs "
        f"onnxruntime >= {manifest.get('min_onnxruntime')}; exported with {exporter}"
    )
    bad: list[str] = []
    rows = [("file", "bytes", "sha256", "check")]
    for name, entry in sorted(manifest.get("files", {}).items()):
        status = file_status(path, name, entry)
        if status != "ok":
            bad.append(name)
        rows.append((name, f"{entry.get('bytes', 0):,}", entry.get("sha256", "")[:16], status))
    lines += ["files:", format_table(rows, "  ")]
    for variant, info in manifest.get("variants", {}).items():
        verified = "verified" if info.get("verified") else "not verified"
        lines.append(f"variant {variant} ({verified}):")
        for graph in ("encoder", "decoder"):
            name = info.get(graph)
            if name and name not in bad and (path / name).is_file():
                lines.append(f"  {name}")
                lines.append(format_table(_graph_io(path / name), "    "))
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
    load_bundle(bundle)  # the checks of Generator.load: a BundleError says which failed
    click.echo("check: ok (every check that loading the bundle runs)")
