"""examples/node: the one-graph search variant run from Node.js with onnxruntime-node (npm).

Skipped with the reason when node or npm is missing, or when npm cannot install
onnxruntime-node (e.g. offline); `make node-example` installs it into the ignored
examples/node/node_modules.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli

NODE_DIR = Path(__file__).parents[1] / "examples" / "node"
WORDS = ["abc", "hgfedcba", "j", "cafebabe", "aaaaaaaaaaaaaaaaaaa", "bad"]


@pytest.fixture(scope="module")
def node() -> str:
    """The node executable, with onnxruntime-node installed next to the example."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed")
    if not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir():
        proc = subprocess.run(
            [npm, "run", "setup"], cwd=NODE_DIR, capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            pytest.skip(f"npm could not install onnxruntime-node: {lines[-1] if lines else ''}")
    return node


def _node(node: str, *args: str) -> subprocess.CompletedProcess:
    command = [node, "generate.mjs", *args]
    return subprocess.run(command, cwd=NODE_DIR, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("beam", [4, 1])
def test_node_example_reproduces_edgeseq_generate(node: str, search_bundle: Path, beam: int):
    proc = _node(node, str(search_bundle), "--beam", str(beam), *WORDS)
    assert proc.returncode == 0, proc.stderr
    argv = ["generate", str(search_bundle), "--beam", str(beam), "--provider", "cpu"]
    expected = CliRunner().invoke(cli, [*argv, "--search", "loop", *WORDS])
    assert expected.exit_code == 0
    assert proc.stdout == expected.stdout and len(proc.stdout.splitlines()) == len(WORDS)


def test_node_example_refuses_a_bundle_without_the_variant(node: str, runtime_case) -> None:
    proc = _node(node, str(runtime_case.bundle), "abc")
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith("has no search variant; export it with --variants "
                                        "fp32,search")  # fmt: skip
