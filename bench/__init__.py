"""edgeseq.bench: the `edgeseq bench` harness, beside the runtime, not part of it.

- `timing.py`: `BenchSpec`, `time_search` (the one timing harness) and `run_isolated`;
- `ort_worker.py` / `torch_worker.py`: one engine measured in a fresh process;
- `compare.py`: every engine in rounds, and the ratios between them;
- `sources.py`: which inputs are timed; `report.py`: the Markdown table and the chart;
- `cli.py`: the `edgeseq bench` command.

The onnxruntime side imports only the runtime; the PyTorch worker imports torch.
"""
