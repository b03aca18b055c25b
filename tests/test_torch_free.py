"""`edgeseq.runtime` works where torch cannot be imported (issue 4).

Each test runs a fresh interpreter, so what the test process itself imported does not count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions

# Makes `import torch` (and torch.*) fail as on a machine without it.
BLOCK_TORCH = textwrap.dedent(
    """
    import sys

    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, BlockTorch())
    """
)

IMPORT_ALL = textwrap.dedent(
    """
    import importlib, pkgutil
    import edgeseq.runtime as runtime
    modules = sorted(m.name for m in pkgutil.iter_modules(runtime.__path__))
    for name in modules:
        importlib.import_module(f"edgeseq.runtime.{name}")
    """
)


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_importing_every_runtime_module_never_imports_torch() -> None:
    code = IMPORT_ALL + textwrap.dedent(
        """
        import json, sys
        banned = ("torch", "onnx", "onnxscript", "safetensors")
        heavy = sorted(m for m in banned if m in sys.modules)
        print(json.dumps({"modules": modules, "heavy": heavy}))
        """
    )
    report = json.loads(python(code).stdout)
    assert {"bundle", "generator", "providers", "results", "search"} <= set(report["modules"])
    assert report["heavy"] == []


def test_the_runtime_commands_modules_never_import_torch() -> None:
    """cli/generate.py, cli/serve.py, cli/models.py and cli/evaluate.py (a bundle's path) import
    no torch, onnx or training code when loaded."""
    code = textwrap.dedent(
        """
        import importlib, json, sys
        for name in ("generate", "serve", "models", "evaluate", "options"):
            importlib.import_module(f"edgeseq.cli.{name}")
        banned = ("torch", "onnx", "onnxscript", "safetensors", "edgeseq.export")
        print(json.dumps(sorted(m for m in banned if m in sys.modules)))
        """
    )
    assert json.loads(python(code).stdout) == []


def test_without_torch_a_bundle_loads_and_generates(runtime_case) -> None:
    code = (
        BLOCK_TORCH
        + IMPORT_ALL
        + textwrap.dedent(
            """
        import json
        try:
            import torch
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit("torch should be blocked")
        from edgeseq.runtime import GenerationOptions, Generator
        gen = Generator.load(sys.argv[1], providers="cpu", threads=1)
        texts = ["abc", "hgfedcba"]
        results = [r.text for r in gen.generate(texts)]
        results += [r.text for r in gen.generate(texts, GenerationOptions(beam_size=4))]
        print(json.dumps(results))
        """
        )
    )
    got = json.loads(python(code, str(runtime_case.bundle)).stdout)
    gen = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
    texts = ["abc", "hgfedcba"]
    expected = [r.text for r in gen.generate(texts)]
    expected += [r.text for r in gen.generate(texts, GenerationOptions(beam_size=4))]
    assert got == expected


def test_without_torch_the_cli_generates(runtime_case) -> None:
    code = BLOCK_TORCH + textwrap.dedent(
        """
        from edgeseq.cli.main import main
        main(["generate", sys.argv[1], "--provider", "cpu", "--threads", "1", "abc", "--json"])
        """
    )
    line = json.loads(python(code, str(runtime_case.bundle)).stdout)
    assert line["input"] == "abc" and line["output"] == "CBA"
