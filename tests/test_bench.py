"""`edgeseq bench` and benchmarks/g2p_vs_g2p_en.py: numbers are produced and well formed.

Speed itself is never asserted here (DESIGN.md: performance is measured by `edgeseq bench`,
not by timed tests); these tests check that every number is there, positive and consistent.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgeseq.bench.isolated import ORT_WORKER, WorkerError, run_isolated
from edgeseq.bench.report import markdown_report
from edgeseq.cli.bench import parse_batch_sizes
from edgeseq.cli.main import cli
from edgeseq.runtime.errors import MissingDependencyError, OptionsError
from edgeseq.runtime.manifest import read_manifest, write_manifest
from edgeseq.runtime.search_timing import BenchSpec, summarize, time_search

ROOT = Path(__file__).resolve().parents[1]
BATCH_STATS = {"tokens_per_s", "seq_ms_p50", "seq_ms_p90", "token_ms_p50", "tokens", "inputs"}
ENGINE_KEYS = {"engine", "kind", "variant", "load_s", "file_bytes", "peak_rss_mb", "batches"}
QUICK = ["--repeats", "1", "--batch-sizes", "1,2", "--inputs", "5", "--max-new-tokens", "8"]


@pytest.fixture(scope="module")
def checkpoint(runtime_case, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runtime_case model saved as a checkpoint (the bundle was exported from it)."""
    from edgeseq.build_model.checkpoint import save_checkpoint

    path = tmp_path_factory.mktemp("bench") / "ckpt"
    task = {"name": "reverse", "options": {}}
    return save_checkpoint(path, runtime_case.model, runtime_case.tokenizers, task, {"step": 0})


@pytest.fixture(scope="module")
def with_checkpoint(runtime_case, checkpoint: Path, tmp_path_factory) -> tuple:
    """`edgeseq bench BUNDLE --checkpoint CKPT --rounds 2 --json --plot` run once:
    (result, report, png)."""
    out = tmp_path_factory.mktemp("bench-out")
    args = ["bench", str(runtime_case.bundle), "--checkpoint", str(checkpoint), *QUICK]
    args += ["--rounds", "2"]
    args += ["--json", str(out / "bench.json"), "--plot", str(out / "bench.png")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "bench.json").read_text()), out / "bench.png"


def check_engine(engine: dict, batch_sizes: tuple[str, ...], inputs: int) -> None:
    assert set(engine) >= ENGINE_KEYS
    assert engine["load_s"] > 0 and engine["file_bytes"] > 0 and engine["peak_rss_mb"] > 0
    assert sorted(engine["batches"]) == sorted(batch_sizes)
    for stats in engine["batches"].values():
        assert set(stats) >= BATCH_STATS
        assert stats["inputs"] == inputs and stats["tokens"] >= inputs  # >= 1 token each
        assert stats["tokens_per_s"] > 0 and stats["token_ms_p50"] > 0
        assert 0 < stats["seq_ms_p50"] <= stats["seq_ms_p90"]


def test_bench_without_checkpoint_is_a_torch_free_table_and_json(runtime_case, tmp_path) -> None:
    args = ["bench", str(runtime_case.bundle), *QUICK, "--json", str(tmp_path / "b.json")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "b.json").read_text())
    assert {"bundle", "machine", "settings", "engines", "skipped", "ratios"} <= set(report)
    assert report["settings"]["threads"] == 1 and report["settings"]["batch_sizes"] == [1, 2]
    assert report["settings"]["inputs_from"].startswith("task reverse, test split")
    assert report["ratios"] == {} and report["skipped"] == []
    [engine] = report["engines"]
    assert engine["engine"] == "onnxruntime fp32" and engine["torch_imported"] is False
    check_engine(engine, ("1", "2"), inputs=5)
    assert (
        "| onnxruntime fp32 | 1 |" in result.stdout and "| onnxruntime fp32 | 2 |" in result.stdout
    )
    assert "pytorch" not in result.stdout


def test_bench_cli_runs_where_torch_cannot_be_imported(runtime_case) -> None:
    code = (
        "import sys; from edgeseq.bench.ort_worker import block_torch; block_torch(); "
        "from edgeseq.cli.main import main; main(sys.argv[1:])"
    )
    args = ["bench", str(runtime_case.bundle), *QUICK, "--batch-sizes", "1"]
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "| onnxruntime fp32 | 1 |" in proc.stdout


def test_bench_with_checkpoint_has_pytorch_rows_and_ratios(with_checkpoint) -> None:
    result, report, _ = with_checkpoint
    torch_run, ort_run = report["engines"]
    assert torch_run["kind"] == "pytorch" and torch_run["threads"] == 1
    assert torch_run["rounds"] == ort_run["rounds"] == report["settings"]["rounds"] == 2
    check_engine(torch_run, ("1", "2"), inputs=5)
    check_engine(ort_run, ("1", "2"), inputs=5)
    for batch in ("1", "2"):
        ratio = report["ratios"]["fp32"][batch]
        ort_rounds = ort_run["batches"][batch]["tokens_per_s_rounds"]
        torch_rounds = torch_run["batches"][batch]["tokens_per_s_rounds"]
        per_round = [o / t for o, t in zip(ort_rounds, torch_rounds, strict=True)]
        assert ratio["tokens_per_s_rounds"] == pytest.approx(per_round)
        assert ratio["tokens_per_s"] == pytest.approx(np.median(per_round))
        assert ratio["same_tokens"] is True  # fp32 and PyTorch did the same work
        assert len(ort_run["batches"][batch]["tokens_per_s_runs"]) == 2  # 1 pass x 2 rounds
    lines = result.stdout.splitlines()
    assert any(line.startswith("| pytorch eager | 1 |") for line in lines)
    fp32_row = next(line for line in lines if line.startswith("| onnxruntime fp32 | 1 |"))
    assert f"{report['ratios']['fp32']['1']['tokens_per_s']:.2f}×" in fp32_row


def test_plot_is_a_png(with_checkpoint) -> None:
    _, _, png = with_checkpoint
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ort_worker_blocks_torch_and_reports_memory(runtime_case) -> None:
    spec = BenchSpec([[4, 5, 2], [6, 2]], (1,), repeats=1, max_new_tokens=4)
    result = run_isolated(ORT_WORKER, spec, bundle=str(runtime_case.bundle), variant="fp32")
    assert result["torch_imported"] is False
    assert result["peak_rss_mb"] >= result["baseline_rss_mb"] > 10
    with pytest.raises(WorkerError, match="KeyError: 'bundle'"):
        run_isolated(ORT_WORKER, spec)  # a worker's failure reaches the caller with its reason
    blocked = "from edgeseq.bench.ort_worker import block_torch; block_torch(); import torch"
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True)
    assert proc.returncode != 0 and "blocked by edgeseq bench" in proc.stderr


def test_a_variant_that_cannot_run_is_skipped_with_its_reason(runtime_case, tmp_path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(runtime_case.bundle, bundle)
    (bundle / "decoder.broken.onnx").write_bytes(b"not an onnx graph")
    manifest = read_manifest(bundle)
    manifest["variants"]["broken"] = {"encoder": "encoder.onnx", "decoder": "decoder.broken.onnx"}
    write_manifest(bundle, {k: v for k, v in manifest.items() if k != "files"})
    args = ["bench", str(bundle), *QUICK, "--batch-sizes", "1", "--json", str(tmp_path / "b.json")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "b.json").read_text())
    assert [e["variant"] for e in report["engines"]] == ["fp32"]
    [skip] = report["skipped"]
    assert skip["variant"] == "broken" and "decoder.broken.onnx" in skip["reason"]
    assert "skipped variant broken:" in result.stdout


def test_missing_matplotlib_or_torch_is_one_clear_error(runtime_case, monkeypatch) -> None:
    from edgeseq.cli import bench as cli_bench

    real = importlib.util.find_spec
    for module, option in (("matplotlib", "--plot"), ("torch", "--checkpoint")):
        monkeypatch.setattr(
            cli_bench.importlib.util, "find_spec", lambda n, m=module: None if n == m else real(n)
        )
        args = ["bench", str(runtime_case.bundle), option, "x", *QUICK]
        result = CliRunner().invoke(cli, args)
        assert isinstance(result.exception, MissingDependencyError), result.output
        assert option in str(result.exception)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    with pytest.raises(MissingDependencyError, match="matplotlib"):
        cli_bench.plot_report({}, "x.png")


class CountdownStep:
    """A fake step model: row r emits token 5 for `lengths[r]` steps, then `</s>`."""

    max_len, vocab_size, bos_id, eos_id, pad_id = 16, 8, 1, 2, 0

    def __init__(self, lengths: dict[int, int]) -> None:
        self.lengths = lengths

    def start(self, src_ids: np.ndarray) -> dict:
        return {"rows": [len(np.flatnonzero(r)) for r in src_ids], "past": 0}

    def step(self, state: dict, input_ids: np.ndarray) -> tuple[np.ndarray, dict]:
        logits = np.zeros((len(state["rows"]), 1, self.vocab_size), dtype=np.float32)
        for i, n in enumerate(state["rows"]):
            logits[i, 0, 5 if state["past"] < self.lengths[n] else self.eos_id] = 1.0
        return logits, {"rows": state["rows"], "past": state["past"] + 1}

    def select(self, state: dict, rows: np.ndarray) -> dict:
        return {"rows": [state["rows"][r] for r in rows], "past": state["past"]}


def test_time_search_counts_generated_tokens_with_eos() -> None:
    model = CountdownStep({2: 3, 3: 6})  # a 2-id source yields 3 tokens + </s>, a 3-id one 6 + 1
    spec = BenchSpec([[4, 2], [4, 4, 2], [7, 2]], (1, 2), repeats=2)
    stats = time_search(model, spec)
    for batch in ("1", "2"):
        assert stats[batch]["tokens"] == 4 + 4 + 7 and stats[batch]["inputs"] == 3
        assert len(stats[batch]["tokens_per_s_runs"]) == 2
    capped = time_search(model, BenchSpec([[4, 4, 2]], (1,), repeats=1, max_new_tokens=2))
    assert capped["1"]["tokens"] == 2  # cut by max_new_tokens: no </s>


def test_summarize_medians_and_percentiles() -> None:
    passes = [[(1.0, 2, 10, 5), (1.0, 1, 10, 10)], [(0.5, 2, 10, 5), (0.5, 1, 10, 10)]]
    stats = summarize(passes)
    assert stats["tokens_per_s"] == pytest.approx(15.0)  # median of 10 and 20 tokens/s
    assert stats["tokens"] == 20 and stats["inputs"] == 3
    assert stats["seq_ms_p50"] == pytest.approx(750.0)  # 3 inputs at 1000 ms, 3 at 500 ms
    assert stats["token_ms_p50"] == pytest.approx(100.0)  # 200, 100, 100, 50 ms per step


def test_bad_options_are_refused() -> None:
    assert parse_batch_sizes("1, 32") == (1, 32)
    for text in ("", "0,1", "a"):
        with pytest.raises(Exception, match="positive integers"):
            parse_batch_sizes(text)
    with pytest.raises(OptionsError, match=r"no inputs.*repeats must be >= 1"):
        BenchSpec([], (1,), repeats=0).check()


def test_markdown_without_pytorch_shows_no_ratio() -> None:
    stats = {"tokens_per_s": 1000.0, "seq_ms_p50": 2.0, "seq_ms_p90": 3.0, "token_ms_p50": 0.1}
    engine = {"engine": "onnxruntime int8", "kind": "onnxruntime", "variant": "int8"}
    engine |= {"load_s": 0.1, "file_bytes": 2e6, "peak_rss_mb": 90.0, "batches": {"1": stats}}
    report = {
        "bundle": "b", "engines": [engine], "skipped": [], "ratios": {},
        "machine": {"cpu_count": 2, "processor": "x86_64", "loadavg_before": [1.0],
                    "loadavg_after": [1.5]},
        "settings": {"search": "greedy", "max_new_tokens": None, "threads": 1,
                     "provider": "cpu", "optimization": "all", "inputs": 3, "rounds": 1,
                     "inputs_from": "random", "repeats": 1, "warmup": True},
    }  # fmt: skip
    text = markdown_report(report)
    assert "| onnxruntime int8 | 1 | 1,000.0 | — | 2.00 | 3.00 | 0.100 | 0.100 | 2.0 | 90 |" in text
    assert "load average 1.00 → 1.50" in text


# -- benchmarks/g2p_vs_g2p_en.py -----------------------------------------------------------------
def load_script(name: str = "g2p_vs_g2p_en"):
    """A benchmark script as a module (benchmarks/ is not a package)."""
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_g2p_scoring_against_any_reference_with_and_without_stress() -> None:
    script = load_script()
    hyps = ["K AE1 T", "D AO1 G", "B ER2 D"]
    refs = [["K AE1 T"], ["D AA1 G", "D AO1 G"], ["B ER1 D"]]
    m = script.score_predictions(hyps, refs)
    assert m["wer"] == pytest.approx(1 / 3) and m["per"] == pytest.approx(1 / 9)
    assert m["wer_nostress"] == 0.0 and m["per_nostress"] == 0.0


@pytest.mark.skipif(importlib.util.find_spec("g2p_en") is None, reason="g2p_en not installed")
def test_g2p_en_loads_offline_and_batching_spells_like_predict() -> None:
    script = load_script()
    g2p = script.load_g2p_en()
    words = ["hello", "benchmark", "a", "onnxruntime", "o'brien", "zyzzyva"]
    single = [g2p.predict(w) for w in words]
    assert single[0] == ["HH", "EH1", "L", "OW0"]
    assert script.batched_predict(g2p, words) == single


# -- benchmarks/variant_accuracy.py --------------------------------------------------------------
def test_variant_accuracy_fp32_row_equals_evaluate_on_the_checkpoint(
    runtime_case, checkpoint: Path, tmp_path: Path, capsys
) -> None:
    """The ORT fp32 row scores exactly what `edgeseq evaluate` scores with PyTorch."""
    from edgeseq.build_model.checkpoint import load_checkpoint
    from edgeseq.build_model.evaluation import evaluate_model
    from edgeseq.build_model.tasks import load_task

    script = load_script("variant_accuracy")
    out = tmp_path / "rows.json"
    args = [str(runtime_case.bundle), "--split", "dev", "--limit", "30", "--threads", "1"]
    assert script.main([*args, "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())
    model, tokenizers, _ = load_checkpoint(checkpoint)
    expected = evaluate_model(model, tokenizers, load_task("reverse"), "dev", limit=30)
    assert row["variant"] == "fp32" and row["agreement_with_fp32"] == 1.0
    for key, value in expected.items():
        assert row[key] == pytest.approx(value), key
    assert "| fp32 | " in capsys.readouterr().out


# -- benchmarks/train_step.py --------------------------------------------------------------------
def test_train_step_benchmark_reports_padding_and_both_precisions(capsys) -> None:
    script = load_script("train_step")
    lengths = [(n, n) for n in range(2, 40)] * 20
    assert 0 <= script.padding(lengths, 400, 0.0) < script.padding(lengths, 400, 0.7)
    recipe = str(ROOT / "models" / "recipes" / "tiny.json")
    args = ["--recipe", recipe, "--task", "reverse", "--steps", "2"]
    assert script.main(args) == 0
    out = capsys.readouterr().out
    assert "| 0.0 |" in out and "| fp32 |" in out and "| bf16 |" in out and "speed-up" in out


# -- benchmarks/decoder_profile.py ---------------------------------------------------------------
def test_decoder_profile_counts_kernel_time_and_no_layer_slicing(runtime_case, tmp_path) -> None:
    """The profile has the decoder's MatMuls, and Split only where a fused Q/K/V projection
    is separated (one per self-attention, beside its cross-attention: half the fused
    attention nodes): with one K/V tensor per layer nothing slices a stacked cache."""
    from edgeseq.runtime.search import GenerationOptions

    script = load_script("decoder_profile")
    words = ["abc", "hgfedcba", "j", "abcabcab"] * 3
    for generation in (
        GenerationOptions(batch_size=4),
        GenerationOptions(batch_size=4, beam_size=3),
    ):
        profile, seconds = script.profile_decoder(
            str(runtime_case.bundle), "fp32", words, generation, 1, 1, str(tmp_path)
        )
        micros, events = script.kernel_time_by_op(profile)
        assert seconds > 0 and micros["MatMul"] > 0 and events["MatMul"] > 0
        nodes = script.kernel_time_by_node(profile)  # the same time, split by node
        for op in micros:
            assert sum(v for (_, o), v in nodes.items() if o == op) == micros[op]
        assert len([o for _, o in nodes if o == "MatMul"]) > 1
        assert set(micros) == set(events) and all(v >= 0 for v in micros.values())
        assert events.get("Split", 0) * 2 == events.get("MultiHeadAttention", 0)
        loop = script.loop_share(str(runtime_case.bundle), "fp32", words, generation, 1)
        assert loop["wall_s"] > loop["decoder_s"] > 0 and loop["encoder_s"] > 0
        assert 0 < loop["python_share"] < 1


def test_decoder_profile_profiles_the_decoder_generate_runs(in_place_bundle, tmp_path) -> None:
    """Beam search on a bundle with the in-place decoder: the profile and the loop's timing
    are of `DecoderMaskedMultiHeadAttention` steps (what `generate` runs), decoder.onnx's
    copying loop only with decoder "copy"."""
    from edgeseq.runtime.search import GenerationOptions

    script = load_script("decoder_profile")
    words = ["abc", "hgfedcba", "j", "abcabcab"] * 2
    beam = GenerationOptions(batch_size=4, beam_size=3).filled()
    for decoder, in_place in (("auto", True), ("copy", False)):
        directory = tmp_path / decoder
        directory.mkdir()
        profile, _ = script.profile_decoder(
            str(in_place_bundle), "fp32", words, beam, 1, 1, str(directory), decoder
        )
        _, events = script.kernel_time_by_op(profile)
        assert (events.get("DecoderMaskedMultiHeadAttention", 0) > 0) == in_place
        loop = script.loop_share(str(in_place_bundle), "fp32", words, beam, 1, decoder)
        assert loop["wall_s"] > loop["decoder_s"] > 0


# -- benchmarks/bundle_ab.py ------------------------------------------------------------------
def test_bundle_ab_compares_two_bundles_cell_by_cell(runtime_case, tmp_path, capsys) -> None:
    """A bundle against itself: one line per cell, every input's ids the same; a malformed
    cell is refused."""
    script = load_script("bundle_ab")
    texts = tmp_path / "texts.txt"
    texts.write_text("abc\nhgfedcba\n\nj\nabcabcab\n", encoding="utf-8")
    bundle = str(runtime_case.bundle)
    args = [bundle, bundle, "--input", str(texts), "--cells", "2x2,1x2", "--rounds", "2"]
    assert script.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("beam 2, batch 2:") and lines[2].startswith("greedy, batch 2:")
    assert all(line.endswith("same ids 4/4") for line in lines[1:])
    with pytest.raises(SystemExit):
        script.main([bundle, bundle, "--input", str(texts), "--cells", "4by32"])


# -- benchmarks/harness.py (shared by vs_ctranslate2.py and vs_optimum.py) ---------------------
class _LoggingEngine:
    """One token per source; logs (name, beam, batches) of every call."""

    def __init__(self, name: str, log: list, greedy_only: bool = False) -> None:
        self.name, self.log, self.greedy_only = name, log, greedy_only

    def run(self, batches, beam: int) -> tuple[list, int]:
        self.log.append((self.name, beam, len(batches)))
        count = sum(len(batch) for batch in batches)
        return [()] * count, count


def test_harness_measure_rotates_engines_and_leaves_greedy_only_ones_out_of_beam_cells() -> None:
    harness = load_script("harness")
    log: list = []
    names = ("ctranslate2 fp32", "edgeseq fp32", "pytorch eager")
    engines = [_LoggingEngine(n, log, greedy_only=n == "pytorch eager") for n in names]
    sources = [[7] * n for n in (3, 1, 2, 5, 4)]
    assert harness.cut(sources, 2) == [[[7], [7] * 2], [[7] * 3, [7] * 4], [[7] * 5]]
    cells = harness.measure(engines, sources, batch_sizes=(2,), beams=(1, 4), passes=2)
    assert list(cells) == ["greedy, batch 2", "beam 4, batch 2"]
    assert set(cells["beam 4, batch 2"]) == {"ctranslate2 fp32", "edgeseq fp32"}
    assert cells["greedy, batch 2"]["ctranslate2 fp32"]["ratio_per_pass"] == [1.0, 1.0]
    assert log[:5] == [(n, 1, 2) for n in names] + [(n, 4, 2) for n in names[:2]]  # warm-up
    ct2, ours, eager = names  # each pass and cell starts one engine later than the last
    order = [ct2, ours, eager, ours, ct2, ours, eager, ct2, ct2, ours]
    assert log[5:] == [(n, 1 if i % 5 < 3 else 4, 3) for i, n in enumerate(order)]

    log.clear()
    harness.measure(engines, sources, batch_sizes=(2,), beams=(1,), passes=1, pattern="batch")
    timed = log[3:]  # batch by batch: every engine once per batch, one batch a call
    assert len(timed) == 9 and {calls for _, _, calls in timed} == {1}
    assert sorted(n for n, *_ in timed) == sorted(names * 3)


def test_harness_machine_line_and_bad_option_values() -> None:
    harness = load_script("harness")
    machine = {"model": "cpu", "flags": [], "loadavg_before": [1.0], "loadavg_after": [2.5]}
    line = harness.machine_line(machine, {"edgeseq": "0", "python": "3"}, "1 thread(s)")
    assert line == "cpu (no AVX2), 1 thread(s), load average 1.00 before and 2.50 after; " + (
        "edgeseq 0, python 3"
    )
    assert harness.int_list("1,32") == (1, 32) and harness.positive_int("3") == 3
    for parse, bad in (
        (harness.int_list, "1,x"),
        (harness.int_list, "0"),
        (harness.positive_int, "-1"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            parse(bad)
