"""Run one bundle on the edge targets and compare every output with x86-64 Python.

    python scripts/edge/edge_check.py                      # what `make edge` runs
    python scripts/edge/edge_check.py --targets browser --variants fp32,search-fp32 --inputs 20
    python scripts/edge/edge_check.py --bundle bundles/marian --data heldout.tsv   # any bundle
    python scripts/edge/edge_check.py --bundle bundles/nllb --data held.tsv --target-lang deu_Latn

Inputs: the first N distinct words of the g2p task's test split (the shipped model's own
held-out words), or with --data FILE the first N distinct inputs of a file in `edgeseq export
--data`'s format (one input per line, optionally TAB and references: the references are
ignored), written to OUT/words.txt. Variants: fp32 and int8 are the two graphs driven
by a decode loop (`edgeseq generate --search loop`); search-fp32 and search-int8 are the
bundle's one-graph BeamSearch variant of that precision (`edgeseq generate --search graph`,
greedy); the default is every variant the bundle has (a bundle with a language list has no
search variant: export refuses it, the one-graph search cannot force the target language).
A bundle with a language list runs with its default languages, or those of --source-lang
and --target-lang, on every target (`edgeseq generate --source-lang/--target-lang`,
`bundle.generate(text, {sourceLang, targetLang})`). Reference: that `edgeseq generate BUNDLE
--input words.txt` command on this machine. Targets:

- arm64: scripts/edge/arm64.sh (Debian arm64 root filesystem under qemu-aarch64-static, the
  aarch64 onnxruntime wheel, `edgeseq generate` there);
- browser: scripts/edge/browser_check.mjs (runtime/web/ in headless Chromium, onnxruntime-web
  wasm: `Bundle.generate` for the loop, `Bundle.generateInGraph` for the search variant); it
  also saves the demo page's screenshot with --screenshot.

While it runs, a line on stderr (flushed at once) when each target and variant starts and ends,
with the seconds since the start: the whole check takes minutes, most of them on ARM64 under
emulation (whose first run also builds the root filesystem). At the end it prints one table row
per target and variant: inputs, outputs identical to x86 (same variant),
agreement with x86 fp32 (the two-graph loop's output), and the seconds the target took for all
inputs (emulated ARM64 and a wasm page are correctness checks, not speed measurements). A
target that cannot load a graph (onnxruntime-web without an operator) gets a row saying so.
Exits 1 when an fp32 row (loop or search graph) is not identical to x86, or an x86 search fp32
row differs from the x86 loop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("arm64", "browser")
VARIANTS = ("fp32", "int8", "search-fp32", "search-int8")
LABELS = {"arm64": "arm64 (qemu, python)", "browser": "browser (chromium, wasm)"}


class Progress:
    """Progress lines on stderr, each flushed at once and prefixed with the seconds since the
    check started: `[  74.0s] arm64 (qemu, python) fp32: ...`."""

    def __init__(self, stream=None) -> None:
        self.start = time.perf_counter()
        self.stream = stream  # None: sys.stderr at the time of each line (pytest swaps it)

    def __call__(self, message: str) -> None:
        elapsed = time.perf_counter() - self.start
        print(f"[{elapsed:6.1f}s] {message}", file=self.stream or sys.stderr, flush=True)


class UnsupportedError(Exception):
    """A target cannot load the variant's graph (the message says why)."""


def language_flags(args: argparse.Namespace) -> list[str]:
    """`edgeseq generate` flags of --source-lang and --target-lang (none when unset)."""
    pairs = (("--source-lang", args.source_lang), ("--target-lang", args.target_lang))
    return [part for flag, code in pairs if code for part in (flag, code)]


def bundle_variants(manifest: dict) -> list[str]:
    """The table variants a bundle's manifest has, in VARIANTS' order."""
    have = set(manifest.get("variants") or {}) | {
        f"search-{v}" for v in manifest.get("search") or {}
    }
    return [v for v in VARIANTS if v in have]


def generate_flags(variant: str) -> list[str]:
    """`edgeseq generate` flags of a table variant: fp32 -> loop, search-fp32 -> graph."""
    if variant.startswith("search-"):
        return ["--variant", variant.removeprefix("search-"), "--search", "graph"]
    return ["--variant", variant, "--search", "loop"]


def onnxruntime_web_version() -> str:
    """The version of the onnxruntime-web package the browser check uses."""
    modules = Path(os.environ.get("EDGESEQ_NODE_MODULES", node_modules()))
    package = modules / "onnxruntime-web" / "package.json"
    return json.loads(package.read_text())["version"] if package.is_file() else "?"


def edge_cache() -> Path:
    """The edge checks' cache: $EDGESEQ_EDGE_CACHE, else .edge-cache in the checkout."""
    return Path(os.environ.get("EDGESEQ_EDGE_CACHE", REPO / ".edge-cache"))


def node_modules() -> Path:
    """Where scripts/edge/setup.sh installs the npm packages."""
    return edge_cache() / "npm" / "node_modules"


def test_words(n: int) -> list[str]:
    """The first `n` distinct words of the g2p task's test split."""
    from edgeseq.build_model.tasks import load_task

    words = dict.fromkeys(text for text, _ in load_task("g2p", stress=True).split("test"))
    return list(words)[:n]


def data_inputs(path: Path, n: int) -> list[str]:
    """The first `n` distinct non-empty inputs of an `edgeseq export --data` file (the text
    before the first TAB of each line)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    inputs = dict.fromkeys(line.split("\t")[0] for line in lines if line.split("\t")[0].strip())
    return list(inputs)[:n]


def read_lines(path: Path) -> list[str]:
    """Output lines of a generate run (one per input)."""
    return path.read_text(encoding="utf-8").splitlines()


def x86_reference(
    bundle: Path, words: Path, variant: str, out: Path, languages: list[str]
) -> tuple[list[str], float]:
    """Outputs of `edgeseq generate` (with the `languages` flags) on this machine and the
    seconds it took."""
    edgeseq = Path(sys.executable).with_name("edgeseq")
    target = out / f"x86-{variant}.txt"
    start = time.perf_counter()
    result = subprocess.run(
        [str(edgeseq), "generate", str(bundle), "--input", str(words), *generate_flags(variant),
         "--provider", "cpu", *languages],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        sys.exit(f"error: x86 edgeseq generate ({variant}) failed: {result.stderr.strip()}")
    target.write_text(result.stdout, encoding="utf-8")
    return read_lines(target), time.perf_counter() - start


def run_target(
    target: str, bundle: Path, words: Path, variant: str, out: Path, shot: str | None,
    languages: list[str],
):  # fmt: skip
    """Run one target for one variant with the `languages` flags (language_flags); return its
    output lines and seconds. Raises UnsupportedError when the browser's onnxruntime-web cannot
    load the variant's graph."""
    if target == "arm64":
        env = {**os.environ, "PYTHON": sys.executable, "GENERATE_FLAGS": " ".join(languages)}
        cmd = ["bash", "scripts/edge/arm64.sh", str(bundle), str(words), str(out), variant]
        result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            sys.stderr.write(result.stderr[-3000:])
            sys.exit(f"error: arm64 check ({variant}) failed (exit {result.returncode})")
    else:
        graph = variant.removeprefix("search-")
        search = "loop" if graph == variant else "graph"
        cmd = ["node", "scripts/edge/browser_check.mjs", "--bundle", str(bundle), "--words",
               str(words), "--out", str(out), "--variant", graph, "--search", search,
               *languages]  # fmt: skip
        if shot:
            cmd += ["--screenshot", shot]
        env = {"EDGESEQ_NODE_MODULES": str(node_modules()), **os.environ}
        result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if result.returncode == 3:
            raise UnsupportedError(result.stderr.strip().splitlines()[-1])
        if result.returncode != 0:
            sys.stderr.write(result.stderr[-3000:])
            sys.exit(f"error: browser check ({variant}) failed (exit {result.returncode})")
    seconds = float((out / f"{target}-{variant}.seconds").read_text())
    return read_lines(out / f"{target}-{variant}.txt"), seconds


def same(a: list[str], b: list[str]) -> int:
    """How many lines are equal, position by position (a length mismatch counts as unequal)."""
    return sum(x == y for x, y in zip(a, b, strict=False)) if len(a) == len(b) else 0


def label(variant: str) -> str:
    """Table name of a variant: search-fp32 -> "search fp32"."""
    return variant.replace("-", " ")


def print_table(rows: list[tuple]) -> None:
    """The Markdown table of docs/edge.md."""
    header = ("target", "variant", "inputs", "identical to x86", "agrees with x86 fp32", "time")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for target, variant, n, identical, agree, seconds in rows:
        if isinstance(identical, str):  # a target that cannot run the variant
            print(f"| {target} | {label(variant)} | {n} | {identical} | - | - |")
            continue
        same_x86 = "reference" if identical is None else f"{identical}/{n}"
        print(f"| {target} | {label(variant)} | {n} | {same_x86} | {agree}/{n} | {seconds:.1f} s |")


def failures(rows: list[tuple]) -> list[str]:
    """fp32 rows (loop or search graph) not identical to x86, and an x86 search fp32 row that
    does not agree with the x86 loop."""
    bad = []
    for target, variant, n, identical, agree, _ in rows:
        if variant not in ("fp32", "search-fp32") or isinstance(identical, str):
            continue
        if identical is not None and identical != n:
            bad.append(f"{target} {label(variant)}: {identical}/{n} identical to x86")
        if identical is None and agree != n:
            bad.append(f"{target} {label(variant)}: {agree}/{n} equal to the x86 fp32 loop")
    return bad


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the checks, print the table; 1 when an fp32 row differs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=REPO / "bundles" / "g2p-en")
    parser.add_argument("--inputs", type=int, default=240, help="inputs (default 240)")
    parser.add_argument(
        "--data", type=Path, help="inputs from this file (edgeseq export --data's format)"
    )
    parser.add_argument("--targets", default="arm64,browser", help="arm64, browser or both")
    parser.add_argument(
        "--variants", help=f"of {', '.join(VARIANTS)} (default: every one the bundle has)"
    )
    parser.add_argument("--source-lang", help="a code of the bundle's language list")
    parser.add_argument("--target-lang", help="a code of the bundle's language list")
    parser.add_argument("--out", type=Path, default=edge_cache() / "out")
    parser.add_argument("--screenshot", help="save the demo page's screenshot here (PNG)")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    if unknown := sorted(set(targets) - set(TARGETS)):
        parser.error(f"unknown target {', '.join(unknown)}; use {', '.join(TARGETS)}")
    manifest_path = args.bundle / "manifest.json"
    if not manifest_path.is_file():
        sys.exit(f"error: no bundle at {args.bundle}; export one first (make edge does)")
    manifest = json.loads(manifest_path.read_text())
    variants = [v for v in (args.variants or "").split(",") if v] or bundle_variants(manifest)
    if unknown := sorted(set(variants) - set(VARIANTS)):
        parser.error(f"unknown variant {', '.join(unknown)}; use {', '.join(VARIANTS)}")
    search = manifest.get("search") or {}
    if missing := [v for v in variants if v.startswith("search-") and v[7:] not in search]:
        sys.exit(
            f"error: {args.bundle} has no {', '.join(missing)} graph; export it with "
            "--variants fp32,int8,search (make edge does)"
        )

    progress = Progress()
    languages = language_flags(args)
    config = json.loads((args.bundle / "config.json").read_text())
    if langs := config.get("languages"):
        source = args.source_lang or langs.get("default_source")
        target = args.target_lang or langs.get("default_target")
        progress(f"languages: source {source}, target {target}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.screenshot:
        Path(args.screenshot).parent.mkdir(parents=True, exist_ok=True)
    words = args.out / "words.txt"
    if args.data is not None and not args.data.is_file():
        sys.exit(f"error: --data {args.data} is not a file; pass the inputs file")
    texts = data_inputs(args.data, args.inputs) if args.data else test_words(args.inputs)
    words.write_text("".join(f"{w}\n" for w in texts), encoding="utf-8")
    reference = {}
    rows = []
    for variant in dict.fromkeys(["fp32", *variants]):  # the fp32 loop: every row's yardstick
        progress(f"x86-64 (python) {label(variant)}: start")
        reference[variant], seconds = x86_reference(
            args.bundle, words, variant, args.out, languages
        )
        n = len(reference[variant])
        agree = same(reference[variant], reference["fp32"])
        progress(f"x86-64 (python) {label(variant)}: {n} outputs in {seconds:.1f} s")
        if variant in variants:
            rows.append(("x86-64 (python)", variant, n, None, agree, seconds))
    for target in targets:
        for variant in variants:
            shot = args.screenshot if variant == variants[0] else None
            ref = reference[variant]
            name = f"{LABELS[target]} {label(variant)}"
            progress(f"{name}: start ({len(ref)} inputs)")
            try:
                lines, seconds = run_target(
                    target, args.bundle, words, variant, args.out, shot, languages
                )
            except UnsupportedError as exc:
                progress(f"{name}: {exc}")
                reason = f"not supported by onnxruntime-web {onnxruntime_web_version()}"
                rows.append((LABELS[target], variant, len(ref), reason, None, None))
                continue
            identical, agree = same(lines, ref), same(lines, reference["fp32"])
            progress(f"{name}: {identical}/{len(ref)} identical to x86 in {seconds:.1f} s")
            rows.append((LABELS[target], variant, len(ref), identical, agree, seconds))

    print_table(rows)
    if bad := failures(rows):
        print(f"error: {'; '.join(bad)}; see {args.out}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
