"""benchmarks/vs_optimum.py and marian_opus.py (need the `bench` and `hf` extras).

The cheap tests check the pieces (the bound's arithmetic, the comparison with transformers'
ids, the report's tables); `bench` runs the script end to end on a tiny MarianMT without
Optimum's venv (1-2 min: two graph exports); `opus` builds the opus-mt-sized checkpoint and
checks that `edgeseq export` passes parity against MarianMTModel on it (~10 min). `make test`
runs neither marker.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2", reason="ctranslate2 not installed (extra 'bench')")
pytest.importorskip("transformers", reason="transformers not installed (extra 'hf')")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import marian_opus  # noqa: E402
import optimum_worker  # noqa: E402
import vs_optimum  # noqa: E402
import vs_optimum_engines  # noqa: E402
import vs_optimum_report  # noqa: E402

OPUS_CONFIG = {"d_model": 512, "decoder_ffn_dim": 2048, "decoder_layers": 6, "vocab_size": 32003}


def test_a_decoder_step_of_an_opus_sized_model_reads_about_160_mb() -> None:
    parts = marian_opus.decoder_step_parameters(OPUS_CONFIG)
    # 6 x (self Q,K,V,O + cross Q,O + FFN + 3 norms), cross K/V excluded; 32003 x 512 + bias.
    assert parts["decoder layers"] == 6 * (
        6 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 6 * 512
    )
    assert parts["output projection"] == 32003 * 513
    assert 150e6 < 4 * sum(parts.values()) < 170e6


def test_copy_bandwidth_is_a_plausible_rate() -> None:
    assert 1e8 < marian_opus.copy_bandwidth(megabytes=16, repeats=2) < 1e12


class _Fixed(vs_optimum_engines.Engine):
    def __init__(self, name: str, outputs: list[tuple[int, ...]]) -> None:
        super().__init__()
        self.name, self.fixed = name, outputs

    def decode(self, batches, beam):
        return self.fixed, sum(len(o) + 1 for o in self.fixed)


def test_identical_counts_inputs_equal_to_transformers_per_cell() -> None:
    source = _Fixed(vs_optimum_engines.SOURCE, [(5, 6), (7,), (8, 9)])
    other = _Fixed("edgeseq fp32", [(5, 6), (7, 4), (8, 9)])
    batches = [[[10, 0], [11, 0], [12, 0]]]
    for engine in (source, other):
        engine.run(batches, 1)
        engine.run(batches, 4)
    same = vs_optimum.identical([source, other])
    assert same == {
        "greedy, batch 3": {"edgeseq fp32": [2, 3]},
        "beam 4, batch 3": {"edgeseq fp32": [2, 3]},
    }


def test_ended_row_cuts_at_eos_and_drops_pads() -> None:
    assert optimum_worker.ended_row([5, 6, 0, 7], pad=99) == ((5, 6), True)
    assert optimum_worker.ended_row([5, 99, 6], pad=99) == ((5, 6), False)


def test_the_optimum_worker_searches_like_edgeseqs_marian_parity() -> None:
    from edgeseq.export.sources.generation_config import BEAM_OPTIONS

    # the worker cannot import edgeseq (its own venv); transformers runs through it too
    assert optimum_worker.BEAM_OPTIONS == BEAM_OPTIONS


def _report() -> dict:
    cells = {}
    for cell in ("greedy, batch 1", "beam 4, batch 1"):
        cells[cell] = {
            "ctranslate2 fp32": {"tokens_per_s": [100.0, 110.0]},
            "edgeseq fp32": {"tokens_per_s": [120.0, 121.0]},
            "ctranslate2 int8": {"tokens_per_s": [200.0, 200.0]},
            "edgeseq int8": {"tokens_per_s": [180.0, 220.0]},
        }
    bound = vs_optimum.bandwidth_bound_numbers(OPUS_CONFIG, cells, 10e9)
    return {
        "model": "m",
        "config": {
            "d_model": 512,
            "encoder_layers": 6,
            "decoder_layers": 6,
            "encoder_attention_heads": 8,
            "encoder_ffn_dim": 2048,
            "vocab_size": 32003,
        },
        "sources": "2 held-out sentences",
        "max_new_tokens": 96,
        "passes": 2,
        "threads": 1,
        "greedy_output_lengths": {"min": 1, "median": 2.0, "max": 3, "at_cap": 0},
        "engines": ["ctranslate2 fp32", "ctranslate2 int8", "edgeseq fp32", "edgeseq int8"],
        "cells": cells,
        "skipped": {"optimum": "no venv"},
        "bound": bound,
        "identical_to_transformers": {c: {"edgeseq fp32": [2, 2]} for c in cells},
        "edgeseq_parity": {},
        "optimum_ready": None,
        "machine": {
            "model": "cpu",
            "flags": ["avx2"],
            "cpus": 2,
            "loadavg_before": [1.0],
            "loadavg_after": [2.0],
        },
        "versions": {"edgeseq": "0"},
    }


def test_report_tables_have_the_target_ratios_and_the_bound() -> None:
    report = _report()
    bound = report["bound"]["engines"]
    assert bound["edgeseq fp32"]["step_bytes"] == report["bound"]["fp32_step_bytes"]
    assert bound["ctranslate2 int8"]["step_bytes"] < bound["edgeseq int8"]["step_bytes"]
    fp32_bound = 10e9 / report["bound"]["fp32_step_bytes"]
    assert bound["edgeseq fp32"]["fraction_of_fp32_bound"] == pytest.approx(120.5 / fp32_bound)
    text = vs_optimum_report.markdown(report)
    assert "| *edgeseq fp32 / ctranslate2 fp32* | 1.15× (1.10–1.20) |" in text
    assert "| *edgeseq int8 / ctranslate2 int8* | 1.00× (0.90–1.10) |" in text
    assert "*edgeseq fp32 / optimum*" not in text  # no Optimum numbers, no ratio row
    assert "optimum: skipped: no venv" in text
    assert "| edgeseq fp32 | 2/2 | 2/2 |" in text


def test_bad_bounds_are_refused() -> None:
    for bad in (["--passes", "0"], ["--inputs", "-3"], ["--batch-sizes", "1,x"]):
        with pytest.raises(SystemExit, match="2"):
            vs_optimum.parse_args(["/tmp/w", *bad])


@pytest.mark.bench
def test_tiny_run_without_optimum(tmp_path, capsys) -> None:
    out = tmp_path / "vs.json"
    args = [
        str(tmp_path / "work"),
        "--tiny",
        "--inputs",
        "6",
        "--passes",
        "1",
        "--batch-sizes",
        "1,3",
        "--optimum-python",
        str(tmp_path / "none"),
        "--json",
        str(out),
    ]
    assert vs_optimum.main(args) == 0
    report = json.loads(out.read_text())
    assert "optimum" not in report["engines"] and "not found" in report["skipped"]["optimum"]
    assert sorted(report["cells"]) == [
        "beam 4, batch 1",
        "beam 4, batch 3",
        "greedy, batch 1",
        "greedy, batch 3",
    ]
    for cell in report["identical_to_transformers"].values():
        assert cell["edgeseq fp32"] == [6, 6]  # fp32: transformers' ids on every input
    for cell in report["cells"].values():
        assert cell["ctranslate2 fp32"]["ratio_per_pass"] == [1.0]
        assert all(n["tokens_per_s"][0] > 0 for n in cell.values())
    printed = capsys.readouterr().out
    assert "| *edgeseq int8 / ctranslate2 int8* |" in printed
    assert "optimum: skipped:" in printed


@pytest.mark.opus
@pytest.mark.slow
def test_opus_sized_export_passes_parity_against_marian(tmp_path) -> None:
    marian = marian_opus.build_marian(tmp_path / "marian", marian_opus.OPUS_SIZE)
    data = tmp_path / "heldout.txt"
    data.write_text("\n".join(marian_opus.held_out_sentences(24)) + "\n", encoding="utf-8")
    edgeseq = Path(sys.executable).with_name("edgeseq")
    bundle = tmp_path / "bundle"
    command = [str(edgeseq), "export", str(marian), "--out", str(bundle), "--data", str(data)]
    subprocess.run([*command, "--inputs", "24"], check=True, capture_output=True)
    parity = json.loads((bundle / "manifest.json").read_text())["parity"]
    assert parity["passed"] and parity["source"]["passed"]
    config = json.loads((bundle / "config.json").read_text())["model"]
    vocab = json.loads((marian / "vocab.json").read_text(encoding="utf-8"))
    assert 32000 <= len(vocab) <= 58101 and config["tgt_vocab_size"] == len(vocab) + 1
    assert (config["d_model"], config["n_heads"], config["d_ff"]) == (512, 8, 2048)
    assert config["n_encoder_layers"] == config["n_decoder_layers"] == 6
