"""The layout's rules hold: runtime/ stands alone, export/ sits below bench/, every --help works
without torch, no module imports another's private names, docs/architecture.md names every
module. (Files are split by concept, not by a line count.)

runtime/ is what a deployment installs: by its syntax tree (imports and string constants
alike) it never reaches torch, onnx, build_model, export, bench or cli. export/ never reaches
bench/ (`edgeseq bench` imports the exporter's adapters; what both time with is
runtime/search_timing.py). Every command's `--help` is checked in a fresh interpreter where
torch, onnx and onnxscript cannot be imported.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeseq.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtime"


@dataclass(frozen=True)
class LayerRule:
    """What the modules of one folder (a layer) never import, nor name in a string."""

    folder: str
    banned_modules: tuple[str, ...]  # third-party modules
    banned_packages: tuple[str, ...]  # edgeseq's layers above this one

    def pattern(self) -> re.Pattern[str]:
        """A string naming a banned layer as a module: "edgeseq.export", "build_model.tasks"."""
        named = rf"\bedgeseq\.({'|'.join(self.banned_packages)})\b"
        bare = r"|\bbuild_model\.\w" if "build_model" in self.banned_packages else ""
        return re.compile(named + bare)


RUNTIME_RULE = LayerRule(
    "runtime",
    ("torch", "onnx", "onnxscript", "safetensors"),
    ("build_model", "export", "bench", "cli"),
)
EXPORT_RULE = LayerRule("export", (), ("bench",))
LAYER_RULES = (RUNTIME_RULE, EXPORT_RULE)
SOURCE_DIRS = ("runtime", "build_model", "export", "bench", "cli", "benchmarks", "scripts", "tests")

BLOCK_HEAVY = textwrap.dedent(
    """
    import sys

    class BlockHeavy:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "onnx", "onnxscript"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, BlockHeavy())
    from edgeseq.cli.main import main
    main(sys.argv[1:])
    """
)


def layer_violations(path: Path, depth: int = 0, rule: LayerRule = RUNTIME_RULE) -> list[str]:
    """What in `path` breaks `rule`: imports of banned modules or layers, relative imports
    above the layer's folder (`depth`: the file's folders below it), and strings naming a
    banned layer's modules."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    in_string = rule.pattern()
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > depth + 1:
                found.append(f"line {node.lineno}: relative import above {rule.folder}")
            names = [node.module or ""] if node.level == 0 else []
        for name in names:
            parts = name.split(".")
            top = parts[1] if parts[0] == "edgeseq" and len(parts) > 1 else parts[0]
            if parts[0] in rule.banned_modules or top in rule.banned_packages:
                found.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = in_string.search(node.value)
            if match:
                found.append(f"line {node.lineno}: string names {match.group()}")
    return found


@pytest.mark.parametrize("rule", LAYER_RULES, ids=[r.folder for r in LAYER_RULES])
def test_a_layer_names_no_layer_above_it_not_even_in_strings(rule: LayerRule) -> None:
    folder = ROOT / rule.folder
    problems = {
        str(path.relative_to(ROOT)): layer_violations(
            path, len(path.relative_to(folder).parts) - 1, rule
        )
        for path in sorted(folder.rglob("*.py"))
    }
    assert {path: found for path, found in problems.items() if found} == {}


def test_the_layer_check_catches_imports_and_strings(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch\n"
        "from edgeseq.export.kinds.seq2seq.parity import run_parity\n"
        "from .. import build_model\n"
        'WORKER = "from edgeseq.build_model.tasks import load_task"\n'
        'PLAIN = "export the model, then build the bundle"\n',
        encoding="utf-8",
    )
    found = layer_violations(bad)
    assert [f.split(":")[0] for f in found] == ["line 1", "line 2", "line 3", "line 4"]


def test_the_export_rule_catches_bench_and_allows_torch_and_the_runtime(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch\n"
        "from edgeseq.runtime.search_timing import time_search\n"
        "def measure():\n"
        "    from edgeseq.bench.compare import run_benchmark\n"
        "from ...bench import isolated\n"
        "import edgeseq.bench\n"
        'WORKER = "edgeseq.bench.ort_worker"\n'
        'PLAIN = "timed as edgeseq bench times"\n',
        encoding="utf-8",
    )
    found = layer_violations(bad, depth=1, rule=EXPORT_RULE)
    assert sorted(found) == [
        "line 4: imports edgeseq.bench.compare",
        "line 5: relative import above export",
        "line 6: imports edgeseq.bench",
        "line 7: string names edgeseq.bench",
    ]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_help_works_without_torch(command: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_HEAVY, command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout and "--help" in proc.stdout


def test_a_torch_command_without_torch_names_the_extra(tmp_path) -> None:
    args = ["export", str(tmp_path / "missing-checkpoint"), "--out", str(tmp_path / "b")]
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_HEAVY, *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: this command needs torch: install the training extra: pip install 'edgeseq[train]'"
    ]


def private_imports(paths: list[Path]) -> list[str]:
    """ "file:line module._name" for every `from module import _name` in `paths`."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.name}:{node.lineno} {node.module}.{alias.name}")
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    paths = [p for folder in SOURCE_DIRS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert private_imports(paths) == []


def test_the_private_import_check_finds_one(tmp_path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from edgeseq.export.onnx_export import _run, export_module\n")
    assert private_imports([module]) == ["m.py:1 edgeseq.export.onnx_export._run"]


def test_architecture_md_names_every_module() -> None:
    """docs/architecture.md is where a reader finds each module: it names every one (and every
    shared recipe and benchmark model config)."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    folders = ("runtime", "build_model", "export", "bench", "cli", "benchmarks")
    modules = [p for f in folders for p in (ROOT / f).rglob("*.py") if p.name != "__init__.py"]
    modules += list((RUNTIME / "web").glob("*.mjs"))
    modules += [
        *(ROOT / "models" / "recipes").glob("*.json"),
        *(ROOT / "benchmarks").glob("*.json"),
    ]
    named = [p for p in modules if re.search(rf"[`/]{re.escape(p.name)}`", page)]
    assert sorted(str(p.relative_to(ROOT)) for p in set(modules) - set(named)) == []


def module_name(path: Path, root: Path) -> str:
    """root/runtime/kinds/seq2seq.py -> "runtime.kinds.seq2seq"; a package's __init__ is the
    package ("runtime.kinds")."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere (inside functions too),
    relative imports resolved; `from . import x` counts x when x is a module."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name.removeprefix("edgeseq.") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = (node.module or "").removeprefix("edgeseq.")
            targets = [stem, *(f"{stem}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def import_cycles(folder: Path) -> list[list[str]]:
    """Every cycle of module imports inside `folder` (each once, as a path of names)."""
    paths = {module_name(p, folder.parent): p for p in sorted(folder.rglob("*.py"))}
    graph = {name: imported_modules(p, folder.parent, set(paths)) for name, p in paths.items()}
    cycles, done = [], set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            cycle = stack[stack.index(node) :]
            if frozenset(cycle) not in done:
                done.add(frozenset(cycle))
                cycles.append([*cycle, node])
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*stack, node])

    for start in sorted(graph):
        visit(start, [])
    return cycles


def test_runtime_has_no_import_cycle() -> None:
    assert import_cycles(RUNTIME) == []


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path) -> None:
    package = tmp_path / "runtime"
    (package / "kinds").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "generator.py").write_text(
        "def load():\n    from .kinds.gpt import GPT\n", encoding="utf-8"
    )
    (package / "kinds" / "__init__.py").write_text("", encoding="utf-8")
    (package / "kinds" / "gpt.py").write_text("from ..generator import load\n", encoding="utf-8")
    assert import_cycles(package) == [
        ["runtime.generator", "runtime.kinds.gpt", "runtime.generator"]
    ]
