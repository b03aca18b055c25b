"""Every extra graph a bundle may hold (runtime/graph_variants.py's registry), tampered in each
way the encoder and decoder entries are tested against: one `error:` line and exit 1 from
`generate`, `serve`, `verify` and `inspect`, a BundleError from the Python API, and a refusal
from the browser runtime. Parametrised over the registry: a variant is covered by being
registered. Each case but the flipped bytes re-hashes the manifest, so checksums alone pass."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest

from edgeseq.cli.main import main
from edgeseq.runtime import constants as C
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.graph_variants import GRAPH_VARIANTS
from edgeseq.runtime.manifest import sha256_file
from edgeseq.runtime.vocabulary import METADATA_KEYS

ROOT = Path(__file__).resolve().parents[1]
NODE = shutil.which("node")
HELPER = Path(__file__).parent / "edge" / "load_bundle.mjs"
KEYS = sorted(GRAPH_VARIANTS)


@pytest.fixture(scope="module")
def every_variant(runtime_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runtime_model exported with fp32 and every registered graph variant (no parity)."""
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle
    from edgeseq.export.variants import VariantOptions

    bundle = tmp_path_factory.mktemp("graph-variants") / "every"
    names = ("fp32", *KEYS)
    export_bundle(
        runtime_model.model, runtime_model.tokenizers, bundle, verify=False,
        variants=VariantOptions(names),
    )  # fmt: skip
    return bundle


def _manifest(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / C.MANIFEST_FILE).read_text())


def _write(bundle: Path, manifest: dict[str, Any], rehash: bool = True) -> None:
    if rehash:
        for name, entry in manifest["files"].items():
            if (bundle / name).is_file():
                entry["sha256"] = sha256_file(bundle / name)
                entry["bytes"] = (bundle / name).stat().st_size
    (bundle / C.MANIFEST_FILE).write_text(json.dumps(manifest))


def _graph(bundle: Path, key: str) -> str:
    return _manifest(bundle)[key]["fp32"]["file"]


def outside(bundle: Path, key: str) -> str:
    name, manifest = _graph(bundle, key), _manifest(bundle)
    shutil.move(bundle / name, bundle.parent / name)
    manifest["files"][f"../{name}"] = manifest["files"].pop(name)
    manifest[key]["fp32"]["file"] = f"../{name}"
    _write(bundle, manifest, rehash=False)
    return "outside the bundle directory"


def absolute(bundle: Path, key: str) -> str:
    manifest = _manifest(bundle)
    manifest[key]["fp32"]["file"] = str((bundle / _graph(bundle, key)).resolve())
    _write(bundle, manifest)
    return "outside the bundle directory"


def missing_file(bundle: Path, key: str) -> str:
    name, manifest = _graph(bundle, key), _manifest(bundle)
    (bundle / name).unlink()
    del manifest["files"][name]
    _write(bundle, manifest)
    return "is missing from the bundle"


def unlisted(bundle: Path, key: str) -> str:
    manifest = _manifest(bundle)
    del manifest["files"][_graph(bundle, key)]
    _write(bundle, manifest)
    return "is not listed in manifest.json"


def entry_not_an_object(bundle: Path, key: str) -> str:
    manifest = _manifest(bundle)
    manifest[key] = [manifest[key]["fp32"]["file"]]
    _write(bundle, manifest)
    return f'"{key}" is not a JSON object'


def precision_not_an_object(bundle: Path, key: str) -> str:
    manifest = _manifest(bundle)
    manifest[key]["fp32"] = manifest[key]["fp32"]["file"]
    _write(bundle, manifest)
    return f'"{key}" lists fp32 without naming its graph file'


def file_not_a_string(bundle: Path, key: str) -> str:
    manifest = _manifest(bundle)
    manifest[key]["fp32"]["file"] = 7
    _write(bundle, manifest)
    return f'"{key}" lists fp32 without naming its graph file'


def flipped_bytes(bundle: Path, key: str) -> str:
    path = bundle / _graph(bundle, key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return "does not match its sha256"


def _rewrite(bundle: Path, key: str, change: Callable[[onnx.ModelProto], None]) -> None:
    path = bundle / _graph(bundle, key)
    model = onnx.load(str(path))
    change(model)
    onnx.save_model(model, str(path))
    _write(bundle, _manifest(bundle))


def input_renamed(bundle: Path, key: str) -> str:
    def rename(model: onnx.ModelProto) -> None:
        old = model.graph.input[0].name
        model.graph.input[0].name = old + "_renamed"
        for node in model.graph.node:
            node.input[:] = [old + "_renamed" if n == old else n for n in node.input]

    _rewrite(bundle, key, rename)
    return "inputs and outputs"


def other_vocabulary(bundle: Path, key: str) -> str:
    def refingerprint(model: onnx.ModelProto) -> None:
        for prop in model.metadata_props:
            if prop.key == METADATA_KEYS["source"]:
                prop.value = "0" * 64

    _rewrite(bundle, key, refingerprint)
    return "does not match the vocabulary the graphs were exported with"


TAMPERINGS = [
    outside, absolute, missing_file, unlisted, entry_not_an_object, precision_not_an_object,
    file_not_a_string, flipped_bytes, input_renamed, other_vocabulary,
]  # fmt: skip
# What the browser runtime says of each tampering. It checks every variant's manifest entry
# (without fetching its graph it cannot tell a missing file from an unlisted one), and the
# bytes of the graphs it fetches.
BROWSER_SAYS = {
    outside: "outside the bundle directory",
    absolute: "outside the bundle directory",
    missing_file: "is not listed in manifest.json",
    unlisted: "is not listed in manifest.json",
    entry_not_an_object: "is not a JSON object",
    precision_not_an_object: "without naming its graph file",
    file_not_a_string: "without naming its graph file",
    flipped_bytes: "does not match its sha256",
    other_vocabulary: "does not match the vocabulary the graphs were exported with",
}
GRAPH_PROBLEMS = (flipped_bytes, input_renamed, other_vocabulary)
CASES = [(k, t) for k in KEYS for t in TAMPERINGS]
# The graph problems only where the browser fetches the graph; no inputs renamed (the test
# helper's onnxruntime stand-in opens no session whose inputs it could list).
BROWSER_CASES = [
    (k, t) for k, t in CASES if t in BROWSER_SAYS and (t not in GRAPH_PROBLEMS or k == "search")
]


def _ids(cases: list[tuple[str, Any]]) -> list[str]:
    return [f"{key}-{tamper.__name__}" for key, tamper in cases]


@pytest.fixture
def tampered(request, every_variant: Path, tmp_path: Path) -> tuple[Path, str, str, Any]:
    """(bundle copy, variant key, expected message, tampering) for the (key, tampering) the
    test is parametrised with."""
    key, tamper = request.param
    bundle = tmp_path / "bundle"
    shutil.copytree(every_variant, bundle)
    return bundle, key, tamper(bundle, key), tamper


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return int(exit_info.value.code or 0), capsys.readouterr().err


def test_every_registered_variant_is_exported_verified_and_reported() -> None:
    from edgeseq.export.kinds.seq2seq.graph_variants import VARIANT_EXPORTS
    from edgeseq.export.report import PARITY_ROWS
    from edgeseq.export.variants import VARIANT_NAMES

    assert list(VARIANT_EXPORTS) == ["steps", "inplace", "search"]  # search wraps the others
    assert set(VARIANT_EXPORTS) == set(GRAPH_VARIANTS) == set(PARITY_ROWS)
    assert set(GRAPH_VARIANTS) <= set(VARIANT_NAMES)
    assert all(VARIANT_EXPORTS[k].graphs is GRAPH_VARIANTS[k] for k in GRAPH_VARIANTS)


@pytest.mark.parametrize("tampered", CASES, ids=_ids(CASES), indirect=True)
def test_every_surface_refuses_a_tampered_entry_in_one_line(
    tampered: tuple[Path, str, str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    runtime_case,
) -> None:
    bundle, key, message, _ = tampered
    with pytest.raises(BundleError, match=message):
        Generator.load(bundle, providers="cpu", threads=1)
    import uvicorn

    def served(*_: Any) -> None:
        raise AssertionError(f"edgeseq serve started on a bundle with a tampered {key} entry")

    monkeypatch.setattr(uvicorn.Server, "run", served)
    commands = {
        "generate": ["generate", str(bundle), "abc", "--provider", "cpu", "--threads", "1"],
        "serve": ["serve", str(bundle), "--port", "0", "--provider", "cpu", "--threads", "1"],
        "verify": ["verify", str(bundle), "--checkpoint", str(runtime_case.bundle)],
        "inspect": ["inspect", str(bundle)],
    }
    for command, args in commands.items():
        code, err = _cli(args, capsys)
        lines = err.strip().splitlines()
        assert code == 1, (command, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), (command, err)
        assert message in lines[0] or "tampered or corrupted" in lines[0], (command, err)


@pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
@pytest.mark.parametrize("tampered", BROWSER_CASES, ids=_ids(BROWSER_CASES), indirect=True)
def test_the_browser_refuses_what_it_checks(tampered: tuple[Path, str, str, Any]) -> None:
    """Every entry problem; the bytes, inputs and vocabulary of the graphs it fetches (the
    search graph, with search "both"). The steps and in-place decoders it never fetches."""
    bundle, key, _, tamper = tampered
    search = "both" if key == "search" else "loop"
    out = subprocess.run(
        [NODE, str(HELPER), str(bundle), search], capture_output=True, text=True, timeout=120
    )
    error = json.loads(out.stdout).get("error", "")
    assert error.startswith("BundleError: ") and BROWSER_SAYS[tamper] in error, error


def graph_variants_mjs() -> Any:
    """scripts/graph_variants_mjs.py as a module (it is a script, not part of the package)."""
    path = ROOT / "scripts" / "graph_variants_mjs.py"
    spec = importlib.util.spec_from_file_location("graph_variants_mjs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_browser_table_is_the_one_written_from_the_registry() -> None:
    script = graph_variants_mjs()
    written = script.TABLE_FILE.read_text(encoding="utf-8")
    assert written == script.registry_table(), "run python scripts/graph_variants_mjs.py"
    assert script.main(["--check"]) == 0


def test_the_table_check_refuses_a_stale_file(tmp_path: Path, capsys) -> None:
    script = graph_variants_mjs()
    stale = tmp_path / "graph_variants_table.mjs"
    stale.write_text(script.render({"search": ["fp32"]}), encoding="utf-8")
    assert script.main(["--check", "--out", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert script.main(["--out", str(stale)]) == 0
    assert script.main(["--check", "--out", str(stale)]) == 0


def test_the_browser_knows_every_registered_variant() -> None:
    """What Node.js reads from the written module is the registry (the module is valid JS)."""
    if NODE is None:
        pytest.skip("Node.js is absent (apt install nodejs)")
    code = (
        "import('./runtime/web/graph_variants_table.mjs')"
        ".then(m => console.log(JSON.stringify(m.GRAPH_VARIANTS)))"
    )
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == {k: list(v.files) for k, v in GRAPH_VARIANTS.items()}


def test_verify_reruns_the_group_of_every_variant_the_manifest_lists(
    runtime_model, every_variant: Path, tmp_path: Path
) -> None:
    from edgeseq.build_model.checkpoint import save_checkpoint
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import verify_bundle

    task = {"name": "reverse", "options": {}}
    ckpt = save_checkpoint(
        tmp_path / "ckpt", runtime_model.model, runtime_model.tokenizers, task, {"step": 0}
    )
    lines: list[str] = []
    report = verify_bundle(every_variant, ckpt, ExportOptions(inputs=16, progress=lines.append))
    assert report["passed"]
    assert all(report[key]["passed"] and "fp32" in report[key] for key in GRAPH_VARIANTS)
    assert {key for key in GRAPH_VARIANTS if any(f"parity {key} (fp32)" in s for s in lines)} == (
        set(GRAPH_VARIANTS)
    )
