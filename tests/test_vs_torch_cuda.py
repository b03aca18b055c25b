"""benchmarks/vs_torch_cuda.py (needs the `hf` extra): the command line, and with marker
`bench` the whole run on the CPU provider with a tiny Marian (`--provider cpu --tiny`, the
dry run docs/gpu.md gives; about a minute)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers not installed (extra 'hf')")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import vs_torch_cuda


def test_the_reference_engine_always_runs_and_unknown_engines_are_refused(capsys) -> None:
    args = vs_torch_cuda.parse_args(["w", "--engines", "edgeseq fp16"])
    assert args.engines == ("transformers fp32", "edgeseq fp16")
    assert args.batch_sizes == (1, 32, 128) and args.provider == "cuda"
    with pytest.raises(SystemExit):
        vs_torch_cuda.parse_args(["w", "--engines", "edgeseq int4"])
    assert "unknown engines ['edgeseq int4']" in capsys.readouterr().err


@pytest.mark.bench
def test_a_dry_run_on_the_cpu(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    vs_torch_cuda.main(
        [str(tmp_path / "work"), "--tiny", "--provider", "cpu", "--inputs", "6",
         "--batch-sizes", "1,3", "--passes", "1", "--engines", "edgeseq fp32,edgeseq fp16",
         "--json", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert sorted(report["cells"]) == [
        "beam 4, batch 1", "beam 4, batch 3", "greedy, batch 1", "greedy, batch 3",
    ]  # fmt: skip
    for cell in report["identical"].values():
        assert cell["edgeseq fp32"] == [6, 6]  # fp32: transformers' ids on every input
    assert all(report["memory"][e]["peak_rss_mib"] > 0 for e in report["engines"])
    assert "| edgeseq fp16 |" in capsys.readouterr().out
