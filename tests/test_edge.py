"""Edge targets: the same bundle in headless Chromium (runtime/web/) and on emulated ARM64,
output for output equal to `edgeseq generate` on this machine.

Marked `edge`. They run when `make edge` has built their cache (.edge-cache/npm for the
browser, .edge-cache/arm64 for ARM64; $EDGESEQ_EDGE_CACHE names another) or when
EDGESEQ_EDGE=1 is set (then a missing cache is built: npm packages, an arm64 root filesystem
and aarch64 wheels are downloaded); otherwise they skip with the reason. The model is the
tests' tiny reversal model: the two-graph loop on 203 inputs, and the one-graph search variant
(fp32 and int8, greedy and beam 4) on 15, most of the time going to starting the browser or
the emulated interpreter. Imported bundles (tests/import_cases.py: a MarianMT directory with a
SentencePiece Unigram vocabulary, a tutorial-shaped `nn.Transformer`) get the same checks on
their --data inputs; their exports (~70 s each) run only once the tools and cache are there.
The multilingual imports (conftest.py's m2m_import, mbart50_import: no search variant) run
the browser's loop with their default target language and another.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("EDGESEQ_EDGE_CACHE", REPO / ".edge-cache"))
FORCED = os.environ.get("EDGESEQ_EDGE") == "1"
CHROMIUM = next(
    (p for p in ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium") if Path(p).exists()),
    os.environ.get("CHROMIUM"),
)

pytestmark = pytest.mark.edge


def need(tools: dict[str, bool], cache: Path) -> None:
    """Skip unless every tool exists and the cache is built (or EDGESEQ_EDGE=1)."""
    missing = [name for name, present in tools.items() if not present]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed; make edge installs them")
    if not FORCED and not cache.exists():
        pytest.skip(f"{cache} is not built; run make edge once, or set EDGESEQ_EDGE=1")


def words_file(tmp_path: Path, n: int = 200) -> Path:
    """`n` reversal inputs (letters a-j), plus an empty line and out-of-vocabulary symbols."""
    rng = np.random.default_rng(29)
    words = ["".join(rng.choice(list("abcdefghij"), rng.integers(1, 9))) for _ in range(n)]
    words += ["", "abZc", "é"]
    path = tmp_path / "words.txt"
    path.write_text("".join(f"{w}\n" for w in words), encoding="utf-8")
    return path


def x86_outputs(bundle: Path, words: Path, *flags: str) -> list[str]:
    """`edgeseq generate` output lines on this machine."""
    edgeseq = Path(sys.executable).with_name("edgeseq")
    result = subprocess.run(
        [str(edgeseq), "generate", str(bundle), "--input", str(words), "--provider", "cpu",
         *flags],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return result.stdout.splitlines()


def browser_check(bundle: Path, words: Path, out: Path, *extra: str):
    """Run scripts/edge/browser_check.mjs (installing its npm packages first if needed)."""
    subprocess.run(["bash", "scripts/edge/setup.sh"], cwd=REPO, check=True, capture_output=True)
    command = ["node", "scripts/edge/browser_check.mjs", "--bundle", str(bundle),
               "--words", str(words), "--out", str(out), *extra]  # fmt: skip
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_browser_outputs_equal_python(runtime_case, tmp_path: Path) -> None:
    need({"node": bool(shutil.which("node")), "chromium": bool(CHROMIUM)}, CACHE / "npm")
    words = words_file(tmp_path)
    shot = tmp_path / "page.png"
    result = browser_check(runtime_case.bundle, words, tmp_path, "--screenshot", str(shot))
    assert result.returncode == 0, result.stderr
    got = (tmp_path / "browser-fp32.txt").read_text(encoding="utf-8").splitlines()
    want = x86_outputs(runtime_case.bundle, words)
    assert len(want) == 203
    assert got == want
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_browser_refuses_a_tampered_bundle(runtime_case, tmp_path: Path) -> None:
    need({"node": bool(shutil.which("node")), "chromium": bool(CHROMIUM)}, CACHE / "npm")
    bundle = tmp_path / "bundle"
    shutil.copytree(runtime_case.bundle, bundle)
    with (bundle / "tokenizer.json").open("a", encoding="utf-8") as f:
        f.write(" ")
    result = browser_check(bundle, words_file(tmp_path, 2), tmp_path / "out")
    assert result.returncode == 1
    assert "tokenizer.json does not match its sha256 in manifest.json" in result.stderr


@pytest.mark.parametrize(("variant", "beams", "batch"), [("fp32", 1, 32), ("int8", 4, 4)])
def test_browser_search_graph_equals_python(
    search_bundle: Path, tmp_path: Path, variant: str, beams: int, batch: int
) -> None:
    """Bundle.generateInGraph in Chromium = `edgeseq generate --search graph`, with the CLI's
    batches (int8's dynamic quantization makes an output depend on its batch)."""
    need({"node": bool(shutil.which("node")), "chromium": bool(CHROMIUM)}, CACHE / "npm")
    words = words_file(tmp_path, 12)
    result = browser_check(search_bundle, words, tmp_path, "--variant", variant, "--search",
                           "graph", "--beams", str(beams), "--batch-size", str(batch))  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = (tmp_path / f"browser-search-{variant}.txt").read_text(encoding="utf-8").splitlines()
    flags = ("--variant", variant, "--search", "graph", "--beam", str(beams))
    want = x86_outputs(search_bundle, words, *flags, "--batch-size", str(batch))
    assert len(want) == 15
    assert got == want


def test_browser_search_graph_needs_the_variant(runtime_case, tmp_path: Path) -> None:
    need({"node": bool(shutil.which("node")), "chromium": bool(CHROMIUM)}, CACHE / "npm")
    result = browser_check(runtime_case.bundle, words_file(tmp_path, 2), tmp_path / "out",
                           "--search", "graph")  # fmt: skip
    assert result.returncode == 1
    assert "the bundle has no search graph for variant fp32" in result.stderr


def need_browser() -> None:
    """Skip unless Node, Chromium and the npm cache are there (or EDGESEQ_EDGE=1)."""
    need({"node": bool(shutil.which("node")), "chromium": bool(CHROMIUM)}, CACHE / "npm")


def need_arm64() -> None:
    """Skip unless qemu, debootstrap and the arm64 cache are there (or EDGESEQ_EDGE=1)."""
    tools = {
        "qemu-user-static": bool(shutil.which("qemu-aarch64-static")),
        "debootstrap": bool(shutil.which("debootstrap")),
    }
    need(tools, CACHE / "arm64" / "rootfs")


def arm64(bundle: Path, words: Path, out: Path, *variants: str) -> None:
    """Run scripts/edge/arm64.sh (skipping unless qemu, debootstrap and its cache exist)."""
    need_arm64()
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", "scripts/edge/arm64.sh", str(bundle), str(words), str(out), *variants],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]


def test_arm64_outputs_equal_x86(runtime_case, tmp_path: Path) -> None:
    words = words_file(tmp_path)
    arm64(runtime_case.bundle, words, tmp_path, "fp32")
    got = (tmp_path / "arm64-fp32.txt").read_text(encoding="utf-8").splitlines()
    assert got == x86_outputs(runtime_case.bundle, words)


def test_arm64_search_graph_equals_x86(search_bundle: Path, tmp_path: Path) -> None:
    words = words_file(tmp_path, 12)
    arm64(search_bundle, words, tmp_path, "search-fp32", "search-int8", "int8")
    for variant, flags in [
        ("search-fp32", ("--variant", "fp32", "--search", "graph")),
        ("search-int8", ("--variant", "int8", "--search", "graph")),
        ("int8", ("--variant", "int8", "--search", "loop")),
    ]:
        got = (tmp_path / f"arm64-{variant}.txt").read_text(encoding="utf-8").splitlines()
        assert got == x86_outputs(search_bundle, words, *flags), variant


# -- imported bundles (issue 37): tests/import_cases.py's exports, session fixtures -------------
IMPORTED = ["marian_import", "torch_import"]
# Inputs beside the --data ones: an empty line, and symbols outside each source vocabulary.
IMPORTED_EXTRA = {"marian_import": ["", "ẞ ☃ 42"], "torch_import": ["", "a Z b", "hello"]}
# variant of arm64.sh / the table -> `edgeseq generate` flags on x86
IMPORTED_VARIANTS = {
    "fp32": ("--variant", "fp32", "--search", "loop"),
    "int8": ("--variant", "int8", "--search", "loop"),
    "search-fp32": ("--variant", "fp32", "--search", "graph"),
    "search-int8": ("--variant", "int8", "--search", "graph"),
}


def imported_words(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> tuple:
    """(bundle, words file) of an imported case: its --data inputs, then IMPORTED_EXTRA."""
    case = request.getfixturevalue(name)
    lines = case["data"].read_text(encoding="utf-8").splitlines()
    words = [line.split("\t")[0] for line in lines] + IMPORTED_EXTRA[name]
    path = tmp_path / "words.txt"
    path.write_text("".join(f"{w}\n" for w in words), encoding="utf-8")
    return case["bundle"], path


@pytest.mark.parametrize("name", IMPORTED)
def test_arm64_imported_bundle_equals_x86(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    """Both graphs and the search graph, fp32 and int8, of an imported bundle on emulated
    ARM64 = `edgeseq generate` on x86 (what `make edge EDGE_SOURCE=...` checks)."""
    need_arm64()
    bundle, words = imported_words(request, name, tmp_path)
    arm64(bundle, words, tmp_path, *IMPORTED_VARIANTS)
    for variant, flags in IMPORTED_VARIANTS.items():
        got = (tmp_path / f"arm64-{variant}.txt").read_text(encoding="utf-8").splitlines()
        assert got == x86_outputs(bundle, words, *flags), variant


@pytest.mark.parametrize("name", IMPORTED)
def test_browser_imported_bundle_equals_python(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    """runtime/web on an imported bundle (Marian: the Unigram tokenizer) = `edgeseq generate`:
    the loop, and the search graph (fp32 greedy, int8 beam 4) in the CLI's batches."""
    need_browser()
    bundle, words = imported_words(request, name, tmp_path)
    result = browser_check(bundle, words, tmp_path)
    assert result.returncode == 0, result.stderr
    got = (tmp_path / "browser-fp32.txt").read_text(encoding="utf-8").splitlines()
    want = x86_outputs(bundle, words)
    assert len(want) == len(words.read_text(encoding="utf-8").splitlines())
    assert got == want
    for variant, beams, batch in (("fp32", 1, 32), ("int8", 4, 4)):
        search = ("--variant", variant, "--search", "graph", "--beams", str(beams))
        result = browser_check(bundle, words, tmp_path, *search, "--batch-size", str(batch))
        assert result.returncode == 0, result.stderr
        got = (tmp_path / f"browser-search-{variant}.txt").read_text("utf-8").splitlines()
        flags = (*IMPORTED_VARIANTS[f"search-{variant}"], "--beam", str(beams))
        assert got == x86_outputs(bundle, words, *flags, "--batch-size", str(batch)), variant


# -- bundles with a language list (issue 45): no search variant, a target language forced ----
@pytest.mark.parametrize("name", ["m2m_import", "mbart50_import"])
def test_browser_language_bundle_equals_python(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    """runtime/web's loop on a multilingual import = `edgeseq generate`, with the bundle's
    default target language and with another one (`browser_check.mjs --target-lang`, what
    `make edge EDGE_TARGET_LANG=...` runs)."""
    need_browser()
    case = request.getfixturevalue(name)
    words = tmp_path / "words.txt"
    lines = case["data"].read_text(encoding="utf-8").splitlines()
    words.write_text("".join(f"{line.split(chr(9))[0]}\n" for line in lines), encoding="utf-8")
    config = json.loads((case["bundle"] / "config.json").read_text())
    languages = config["languages"]
    other = next(code for code in languages["codes"] if code != languages["default_target"])
    outputs = []
    for flags in ((), ("--target-lang", other)):
        result = browser_check(case["bundle"], words, tmp_path, *flags)
        assert result.returncode == 0, result.stderr
        outputs.append((tmp_path / "browser-fp32.txt").read_text(encoding="utf-8").splitlines())
        assert outputs[-1] == x86_outputs(case["bundle"], words, *flags), flags
    assert outputs[0] != outputs[1]  # the target language reached the page
