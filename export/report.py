"""Parity reports, variant gates and gate attempts as text tables: what `edgeseq export`,
`edgeseq verify` and `edgeseq inspect` print.

    print(format_parity(manifest["parity"]))      # levels 1-3 (and 4: the search graph)
    print(format_variants(manifest))              # one row per variant with its gate
    print(format_attempts(exc.attempts))          # GateError: what the int8 gate tried

Torch-free (the runtime's constants only), so a torch-free `edgeseq inspect` shows the
evidence that the export measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeseq.runtime import constants as C

VARIANT_ORDER = ("fp32", "int8", "fp16", "ort")  # display order of the variants table


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
    if "graph" in level1:  # GPT or BERT: one graph, every output by name
        for name, diff in level1["max_abs_diff"].items():
            check = f"{level1['graph']} {name} max|Δ| ({level1['cases']} shapes)"
            rows.append(("1", check, f"{diff:.1e}", ok(diff <= tol)))
    bounds = level1.get("bound", {})  # manifests before it: the tolerance alone
    for name in C.ENCODER_FAMILIES + C.DECODER_FAMILIES:
        if name in level1["max_abs_diff"] and "graph" not in level1:
            diff = level1["max_abs_diff"][name]
            graph = "encoder" if name in C.ENCODER_FAMILIES else "decoder"
            label = f"{name}.*" if name in C.KV_FAMILIES else name  # every layer's tensor
            check = f"{graph} {label} max|Δ| ({level1[f'{graph}_cases']} shapes)"
            rows.append(("1", check, f"{diff:.1e}", ok(diff <= bounds.get(name, tol))))
            if name in level1.get("float64_noise", {}):
                noise = level1["float64_noise"][name]
                factor = level1["noise_factor"]
                check = f"  bound: {tol:.0e} + {factor:g} x torch's float32 error {noise:.1e}"
                rows.append(("1", check, f"{bounds[name]:.1e}", ""))
    level2 = report["level2"]
    size = f"{level2['rows']} rows x {level2['steps']} steps"
    if "live_steps" in level2:  # a row's steps end at its </s> (older manifests: all steps)
        size = f"{level2['rows']} rows, {level2['live_steps']} steps to </s>"
    # "bound" covers both comparisons; older manifests: `tol` cached, "uncached_bound" uncached
    cached_bound = level2.get("bound", tol)
    bound = level2.get("bound", level2.get("uncached_bound", tol))
    diff = level2["max_abs_diff_cached"]
    rows.append(
        ("2", f"step logits vs cached torch ({size})", f"{diff:.1e}", ok(diff <= cached_bound))
    )
    diff = level2["max_abs_diff_uncached"]
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
    if "float64_noise" in level2:
        noise, factor = level2["float64_noise"], level2["noise_factor"]
        check = f"  or {tol:.0e} + {factor:g} x torch's float32 error {noise:.1e}"
        rows.append(("2", check, f"{bound:.1e}", ""))
    level3 = report["level3"]
    check = f"identical greedy sequences ({level3.get('source', '?')})"
    greedy_ok = level3["identical"] == level3["inputs"]
    rows.append(("3", check, f"{level3['identical']}/{level3['inputs']}", ok(greedy_ok)))
    beam = level3.get("beam")
    if beam:
        check = f"identical beam-{beam['beam_size']} best hypotheses (first {beam['inputs']})"
        rows.append(("3", check, f"{beam['identical']}/{beam['inputs']}", ok(beam["passed"])))
    for key, variant_rows in PARITY_ROWS.items():  # one per graph variant of the registry
        rows += variant_rows(report.get(key))
    rows += top_parity_rows(report.get("top"))
    rows += source_parity_rows(report.get("source"))
    lines = [format_table(rows)]
    for m in level3.get("mismatches", []):
        text = m.get("source_text", m["source_ids"])
        lines.append(
            f"  input #{m['index']} {text!r}: first differs at step {m['step']}, "
            f"torch top-2 {m['torch_top2']}, onnx top-2 {m['onnx_top2']}"
        )
    source = report.get("source") or {}
    for name in ("greedy", "beam"):
        for m in source.get("level3", {}).get(name, {}).get("mismatches", []):
            tie = " (near tie)" if m["near_tie"] else ""
            lines.append(
                f"  source {name} input #{m['index']}: first differs at step {m['step']}{tie}, "
                f"source top-2 {m['source_top2']}, onnx top-2 {m['onnx_top2']}"
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


def search_parity_rows(group: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """Rows (level, check, value, result) of a parity report's "search" group for the
    parity table: fp32 graph vs loop must be identical; int8 and ort are reported."""
    if not group:
        return []
    rows = []
    for precision in C.SEARCH_FILES:
        entry = group.get(precision)
        if not entry:
            continue
        for row in entry["rows"]:
            check = (
                f"{precision} search graph = loop, beam {row['beam_size']}, batch {row['batch']}"
            )
            same = row["identical"] == row["inputs"]
            result = ("ok" if same else "FAIL") if precision == "fp32" else "report"
            rows.append(("4", check, f"{row['identical']}/{row['inputs']}", result))
        if "agreement_with_fp32" in entry:
            value = f"{100 * entry['agreement_with_fp32']:.1f}%"
            rows.append(("4", f"{precision} search greedy agreement with fp32", value, "report"))
        if "drop_points" in entry:
            value = f"{entry['fp32']:.2%} -> {entry[precision]:.2%}"
            rows.append(("4", f"{precision} search {entry['metric']} vs fp32", value, "report"))
    return rows


def steps_parity_rows(group: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """Rows (level, check, value, result) of a parity report's "steps" group: the step-batching
    decoder on rows at different positions vs decoder.onnx row by row (fp32 gated)."""
    rows = []
    for precision in C.STEPS_FILES if group else ():
        entry = group.get(precision) if group else None
        if not entry:
            continue
        check = f"{precision} steps decoder: {entry['rows']} rows at different positions = alone"
        result = ("ok" if entry["passed"] else "FAIL") if precision == "fp32" else "report"
        rows.append(("2", check, f"{entry['max_abs_diff']:.1e}", result))
        rows += _noise_row("2", entry)
    return rows


def _noise_row(level: str, entry: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The bound row of a variant group's fp32 entry bounded by the model's float32 error
    (export/kinds/seq2seq/float64_noise.py `bound_of`), or none."""
    if "float64_noise" not in entry:
        return []
    error, factor = entry["float64_noise"], entry["noise_factor"]
    check = f"  bound: {factor:g} x torch's float32 error {error:.1e} (and the tolerance)"
    return [(level, check, f"{entry['bound']:.1e}", "")]


def in_place_parity_rows(group: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """Rows (level, check, value, result) of a parity report's "inplace" group: beam search
    with the in-place cache decoder vs decoder.onnx (fp32 gated)."""
    rows = []
    for precision in C.IN_PLACE_FILES if group else ():
        entry = group.get(precision) if group else None
        if not entry:
            continue
        check = f"{precision} in-place decoder: identical beam-{entry['beam']} hypotheses"
        result = ("ok" if entry["passed"] else "FAIL") if precision == "fp32" else "report"
        value = f"{entry['identical_rows']}/{entry['rows']}"
        rows.append(("3", check, value, result))
        rows += _noise_row("3", entry)
    return rows


def source_parity_rows(group: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """Rows (level, check, value, result) of a parity report's "source" group: the graphs
    against the model an import adapter mapped (export/kinds/seq2seq/source_parity.py)."""
    if not group:
        return []
    ok = lambda passed: "ok" if passed else "FAIL"  # noqa: E731
    rows = []
    for level, what in (("1", "one call"), ("2", "cached steps")):
        entry = group[f"level{level}"]
        check = f"source: logits vs the source model, {what} ({entry['positions']} positions)"
        rows.append((level, check, f"{entry['max_abs_diff']:.1e}", ok(entry["passed"])))
    if "bound" in group["level1"]:  # manifests before it: the tolerance alone
        noise, bound = group["level1"]["torch_cached_vs_uncached"], group["level1"]["bound"]
        tol = group["level1"]["tolerance"]
        check = f"  bound: {tol:.0e} + torch's own cached vs uncached {noise:.1e}"
        rows.append(("", check, f"{bound:.1e}", ""))
        if "float64_noise" in group["level1"]:
            error, factor = group["level1"]["float64_noise"], group["level1"]["noise_factor"]
            check = f"  or {tol:.0e} + {factor:g} x torch's float32 error {error:.1e}"
            rows.append(("", check, f"{bound:.1e}", ""))
    for name in ("greedy", "beam"):
        entry = group["level3"][name]
        ties = f" + {entry['near_ties']} near ties" if entry["near_ties"] else ""
        check = f"source: identical beam-{entry['beam_size']} ids ({entry['source_search']})"
        value = f"{entry['identical']}/{entry['inputs']}{ties}"
        rows.append(("3", check, value, ok(entry["passed"])))
    return rows


def top_parity_rows(group: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """Rows (level, check, value, result) of a parity report's "top" group: the searches on
    the decoder's top-k outputs against the logits (export/kinds/seq2seq/top_parity.py)."""
    if not group:
        return []
    rows = []
    for name in ("greedy", "beam"):
        entry = group[name]
        search = "greedy" if name == "greedy" else f"beam-{entry['beam_size']}"
        ties = f" + {entry['near_ties']} near ties" if entry["near_ties"] else ""
        check = (
            f"top-k outputs: {search} ids as from logits (|Δscore| {entry['max_score_diff']:.0e})"
        )
        value = f"{entry['identical']}/{entry['inputs']}{ties}"
        rows.append(("3", check, value, "ok" if entry["passed"] else "FAIL"))
    return rows


# The parity rows of each graph variant (runtime/graph_variants.py's registry), by key.
PARITY_ROWS: dict[str, Callable[[dict[str, Any] | None], list[tuple[str, str, str, str]]]] = {
    "search": search_parity_rows,
    "steps": steps_parity_rows,
    "inplace": in_place_parity_rows,
}
