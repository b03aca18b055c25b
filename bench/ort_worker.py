"""The onnxruntime side of `edgeseq bench`: one bundle variant timed in this process.

    python -m edgeseq.bench.ort_worker SPEC.json   # prints one JSON line (see measure_ort)

`edgeseq bench` runs this module in a fresh process per engine and round (`run_isolated`).
`main` first makes `import torch` fail, as on a torch-free install, so the peak RSS it
reports is what a deployment needs: interpreter, numpy, onnxruntime, the sessions and runs.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import time
from pathlib import Path
from typing import Any

from edgeseq.runtime.search_timing import BenchSpec, time_search
from edgeseq.runtime.step import StepModel

from .isolated import peak_rss_mb


class TorchBlocker(importlib.abc.MetaPathFinder):
    """A meta-path finder under which `import torch` (and torch.*) raises ModuleNotFoundError."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        """Refuse torch; leave every other module to the next finder."""
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by edgeseq bench)",
                                      name=name)  # fmt: skip
        return None


def block_torch() -> None:
    """Make every later `import torch` in this process fail (idempotent)."""
    if not any(isinstance(finder, TorchBlocker) for finder in sys.meta_path):
        sys.meta_path.insert(0, TorchBlocker())


def measure_ort(
    bundle_dir: str | Path,
    variant: str,
    spec: BenchSpec,
    provider: str = "cpu",
    optimization: str = "all",
) -> dict[str, Any]:
    """Load `variant` of the bundle (graph `optimization` level, see runtime/providers.py)
    and time it: load times, graph bytes, timings, peak RSS."""
    # Imported here, so that the PyTorch worker (which shares time_search) never loads them.
    import onnxruntime as ort

    from edgeseq.runtime.bundle import check_graph_pair, load_bundle
    from edgeseq.runtime.kinds.seq2seq import OrtBoundStep, OrtStep
    from edgeseq.runtime.providers import open_sessions

    baseline = peak_rss_mb()
    start = time.perf_counter()
    bundle = load_bundle(bundle_dir)
    checked = time.perf_counter()
    encoder_path, decoder_path = bundle.graphs(variant)
    encoder, decoder, device = open_sessions(
        encoder_path, decoder_path, provider, spec.threads, optimization
    )
    loaded = time.perf_counter()
    check_graph_pair(bundle, encoder, decoder, variant)
    if device == "cuda":
        step: StepModel = OrtBoundStep(encoder, decoder, bundle.config, "cuda")
    else:
        step = OrtStep(encoder, decoder, bundle.config)
    timings = time_search(step, spec)
    return {
        "engine": f"onnxruntime {variant}",
        "kind": "onnxruntime",
        "variant": variant,
        "device": device,
        "providers": decoder.get_providers(),
        "version": ort.__version__,
        "threads": spec.threads,
        "optimization": optimization,
        "bundle_check_s": checked - start,
        "load_s": loaded - checked,
        "file_bytes": encoder_path.stat().st_size + decoder_path.stat().st_size,
        "files": [encoder_path.name, decoder_path.name],
        "baseline_rss_mb": baseline,
        "peak_rss_mb": peak_rss_mb(),
        "torch_imported": "torch" in sys.modules,
        "batches": timings,
    }


def main(argv: list[str] | None = None) -> None:
    """Worker entry: `SPEC.json` whose `extra` has bundle, variant, provider, optimization;
    prints one JSON line with `measure_ort`'s result. Torch is blocked first."""
    block_torch()
    (spec_path,) = argv if argv is not None else sys.argv[1:]
    spec = BenchSpec.load(spec_path)
    extra = spec.extra
    result = measure_ort(
        extra["bundle"],
        extra["variant"],
        spec,
        extra.get("provider", "cpu"),
        extra.get("optimization", "all"),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
