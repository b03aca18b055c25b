"""Run one bundle on the edge targets and compare every output with x86-64 Python.

    python scripts/edge/edge_check.py                      # what `make edge` runs
    python scripts/edge/edge_check.py --targets browser --variants fp32 --inputs 300

Inputs: the first N distinct words of the g2p task's test split (the shipped model's own
held-out words), written to OUT/words.txt. Reference: `edgeseq generate BUNDLE --input
words.txt --variant V` on this machine. Targets:

- arm64: scripts/edge/arm64.sh (Debian arm64 root filesystem under qemu-aarch64-static, the
  aarch64 onnxruntime wheel, `edgeseq generate` there);
- browser: scripts/edge/browser_check.mjs (runtime/web/ in headless Chromium, onnxruntime-web
  wasm); it also saves the demo page's screenshot with --screenshot.

Prints one table row per target and variant: inputs, outputs identical to x86 (same variant),
agreement with x86 fp32, and the seconds the target took for all inputs (emulated ARM64 and a
wasm page are correctness checks, not speed measurements). Exits 1 when an fp32 row is not
identical.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("arm64", "browser")


def test_words(n: int) -> list[str]:
    """The first `n` distinct words of the g2p task's test split."""
    from edgeseq.build_model.tasks import load_task

    words = dict.fromkeys(text for text, _ in load_task("g2p", stress=True).split("test"))
    return list(words)[:n]


def read_lines(path: Path) -> list[str]:
    """Output lines of a generate run (one per input)."""
    return path.read_text(encoding="utf-8").splitlines()


def run(command: list[str], what: str) -> None:
    """Run `command`; on failure print its stderr tail and exit with one line."""
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-3000:])
        sys.exit(f"error: {what} failed (exit {result.returncode}): {' '.join(command)}")


def x86_reference(bundle: Path, words: Path, variant: str, out: Path) -> tuple[list[str], float]:
    """Outputs of `edgeseq generate` on this machine and the seconds it took."""
    edgeseq = Path(sys.executable).with_name("edgeseq")
    target = out / f"x86-{variant}.txt"
    start = time.perf_counter()
    result = subprocess.run(
        [str(edgeseq), "generate", str(bundle), "--input", str(words), "--variant", variant,
         "--provider", "cpu"],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        sys.exit(f"error: x86 edgeseq generate ({variant}) failed: {result.stderr.strip()}")
    target.write_text(result.stdout, encoding="utf-8")
    return read_lines(target), time.perf_counter() - start


def run_target(target: str, bundle: Path, words: Path, variant: str, out: Path, shot: str | None):
    """Run one target for one variant; return its output lines and seconds."""
    if target == "arm64":
        env = {**os.environ, "PYTHON": sys.executable}
        cmd = ["bash", "scripts/edge/arm64.sh", str(bundle), str(words), str(out), variant]
        result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            sys.stderr.write(result.stderr[-3000:])
            sys.exit(f"error: arm64 check ({variant}) failed (exit {result.returncode})")
    else:
        cmd = ["node", "scripts/edge/browser_check.mjs", "--bundle", str(bundle), "--words",
               str(words), "--out", str(out), "--variant", variant]  # fmt: skip
        if shot:
            cmd += ["--screenshot", shot]
        run(cmd, f"browser check ({variant})")
    seconds = float((out / f"{target}-{variant}.seconds").read_text())
    return read_lines(out / f"{target}-{variant}.txt"), seconds


def same(a: list[str], b: list[str]) -> int:
    """How many lines are equal, position by position (a length mismatch counts as unequal)."""
    return sum(x == y for x, y in zip(a, b, strict=False)) if len(a) == len(b) else 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the checks, print the table; 1 when an fp32 row differs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=REPO / "bundles" / "g2p-en")
    parser.add_argument("--inputs", type=int, default=240, help="test words (default 240)")
    parser.add_argument("--targets", default="arm64,browser", help="arm64, browser or both")
    parser.add_argument("--variants", default="fp32,int8", help="bundle variants to run")
    cache = Path(os.environ.get("EDGESEQ_EDGE_CACHE") or REPO / ".edge-cache")
    parser.add_argument("--out", type=Path, default=cache / "out")
    parser.add_argument("--screenshot", help="save the demo page's screenshot here (PNG)")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    if unknown := sorted(set(targets) - set(TARGETS)):
        parser.error(f"unknown target {', '.join(unknown)}; use {', '.join(TARGETS)}")
    variants = [v for v in args.variants.split(",") if v]
    if not (args.bundle / "manifest.json").is_file():
        sys.exit(f"error: no bundle at {args.bundle}; export one first (make edge does)")

    args.out.mkdir(parents=True, exist_ok=True)
    words = args.out / "words.txt"
    words.write_text("".join(f"{w}\n" for w in test_words(args.inputs)), encoding="utf-8")
    reference = {}
    rows = []
    for variant in variants:
        reference[variant], seconds = x86_reference(args.bundle, words, variant, args.out)
        n = len(reference[variant])
        fp32_agree = same(reference[variant], reference.get("fp32", reference[variant]))
        rows.append(("x86-64 (python)", variant, n, None, fp32_agree, seconds))
    for target in targets:
        for variant in variants:
            shot = args.screenshot if variant == variants[0] else None
            lines, seconds = run_target(target, args.bundle, words, variant, args.out, shot)
            label = "arm64 (qemu, python)" if target == "arm64" else "browser (chromium, wasm)"
            ref = reference[variant]
            fp32_agree = same(lines, reference.get("fp32", ref))
            rows.append((label, variant, len(ref), same(lines, ref), fp32_agree, seconds))

    header = ("target", "variant", "inputs", "identical to x86", "agrees with x86 fp32", "time")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for label, variant, n, identical, agree, seconds in rows:
        same_x86 = "reference" if identical is None else f"{identical}/{n}"
        print(f"| {label} | {variant} | {n} | {same_x86} | {agree}/{n} | {seconds:.1f} s |")
    failed = [r for r in rows if r[1] == "fp32" and r[3] is not None and r[3] != r[2]]
    if failed:
        print(f"error: {len(failed)} fp32 row(s) differ from x86; see {args.out}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
