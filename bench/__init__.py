"""edgeseq.bench: the `edgeseq bench` harness, beside the runtime, not part of it.

- `isolated.py`: `run_isolated` (each engine in a fresh process), `peak_rss_mb`; what every
  engine times is runtime/search_timing.py (`BenchSpec`, `time_search`);
- `ort_worker.py` / `torch_worker.py`: one engine measured in a fresh process;
- `compare.py`: every engine in rounds, and the ratios between them;
- `sources.py`: which inputs are timed; `report.py`: the Markdown table and the chart.

The `edgeseq bench` command that parses the options is cli/bench.py.

The onnxruntime side imports only the runtime; the PyTorch worker imports torch.
"""
