"""The PyTorch eager side of `edgeseq bench`: the same search through `TorchStep`.

    result = measure_torch("runs/g2p/best", spec)      # spec: runtime/search_timing.py's BenchSpec
    result = measure_torch("opus-mt-en-de", spec)      # any source `edgeseq export` reads
    python -m edgeseq.bench.torch_worker SPEC.json     # prints one JSON line

The model is read by export/sources' adapters, as `edgeseq export SOURCE` reads it: an
edgeseq checkpoint, a torch_source.json (or its directory), a Hugging Face MarianMT directory.
What is timed is edgeseq's PyTorch module holding that model's weights (the module the
bundle's parity levels 1-3 compare with), not the source's own code: a user's
`nn.Transformer` has no cached decoding, and `MarianMTModel.generate` runs a search of its own
(benchmarks/vs_optimum.py times it).

`edgeseq bench` runs this in a fresh process (`run_isolated(TORCH_WORKER, ...)`), like each
onnxruntime variant, so every engine starts from a clean interpreter. For a fair comparison
torch uses `spec.threads` intra-op threads and one inter-op thread, decodes with the KV cache
(`Seq2SeqTransformer.decode_step`) under `torch.inference_mode`, and gets the same warm-up.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from edgeseq.build_model.torch_step import TorchStep
from edgeseq.export.sources import open_source
from edgeseq.runtime.errors import CheckpointError, EdgeseqError
from edgeseq.runtime.search_timing import BenchSpec, time_search

from .isolated import peak_rss_mb

# Fields that may differ between a checkpoint and its bundle without changing what runs.
IGNORED_CONFIG_FIELDS = ("dropout",)


def set_threads(threads: int) -> None:
    """`threads` intra-op threads and one inter-op thread (the latter only before any work)."""
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # already set or work started: keep the pool
        torch.set_num_interop_threads(1)


def check_same_model(checkpoint_config: dict[str, Any], bundle_config: dict[str, Any]) -> None:
    """Refuse a checkpoint whose architecture differs from the bundle's (CheckpointError)."""
    differ = sorted(
        key
        for key in set(checkpoint_config) | set(bundle_config)
        if key not in IGNORED_CONFIG_FIELDS and checkpoint_config.get(key) != bundle_config.get(key)
    )
    if differ:
        shown = ", ".join(
            f"{k} {checkpoint_config.get(k)!r} vs {bundle_config.get(k)!r}" for k in differ
        )
        raise CheckpointError(
            f"the checkpoint and the bundle describe different models ({shown}); "
            "pass the checkpoint the bundle was exported from"
        )


def measure_torch(checkpoint: str | Path, spec: BenchSpec) -> dict[str, Any]:
    """Load `checkpoint` (any source export/sources reads) and time `spec`'s search through
    PyTorch eager with the KV cache."""
    set_threads(spec.threads)
    baseline = peak_rss_mb()
    start = time.perf_counter()
    source = open_source(checkpoint)
    model = source.model
    loaded = time.perf_counter()
    if "config" in spec.extra:
        check_same_model(model.cfg.to_dict(), spec.extra["config"])
    with torch.inference_mode():
        timings = time_search(TorchStep(model), spec)
    return {
        "engine": "pytorch eager",
        "kind": "pytorch",
        "variant": None,
        "device": "cpu",
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "source": source.adapter,
        "source_description": source.description,
        "load_s": loaded - start,
        "file_bytes": sum(Path(file).stat().st_size for file in source.weights),
        "files": [Path(file).name for file in source.weights],
        "baseline_rss_mb": baseline,
        "peak_rss_mb": peak_rss_mb(),
        "torch_imported": True,
        "batches": timings,
    }


def main(argv: list[str] | None = None) -> None:
    """Worker entry: `SPEC.json` whose `extra` has the checkpoint (and the bundle's config);
    prints one JSON line with `measure_torch`'s result, or an edgeseq error's message as the
    last line on stderr (exit 1): what `run_isolated` reports."""
    (spec_path,) = argv if argv is not None else sys.argv[1:]
    spec = BenchSpec.load(spec_path)
    try:
        result = measure_torch(spec.extra["checkpoint"], spec)
    except EdgeseqError as exc:
        sys.exit(str(exc))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
