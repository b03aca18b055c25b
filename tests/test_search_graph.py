"""The one-graph search variant (issue 27): export, parity group, runtime path, CLI."""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli
from edgeseq.export.report import search_parity_rows
from edgeseq.runtime import constants as C
from edgeseq.runtime import graph_search
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import BundleError, OptionsError, ParityError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.graph_search import auto_graph_max_hypotheses, step_macs
from edgeseq.runtime.search import GenerationOptions, search

TEXTS = ["abc", "j", "hgfedcba", "aaaaaaaaaaaaaaaaaaa", "bad", "cafebabe", "", "abcdefghij"]
OPTION_CASES = [
    GenerationOptions(),
    GenerationOptions(beam_size=4),
    GenerationOptions(beam_size=4, n_best=4),
    GenerationOptions(beam_size=3, n_best=2, length_penalty=0.6),
    GenerationOptions(beam_size=4, n_best=4, max_new_tokens=3),  # open hypotheses at the budget
    GenerationOptions(max_new_tokens=2),
]


@pytest.fixture(scope="module")
def graph_gen(search_bundle: Path) -> Generator:
    return Generator.load(search_bundle, providers="cpu", threads=1)


@pytest.fixture(scope="module")
def loop_gen(search_bundle: Path) -> Generator:
    return Generator.load(search_bundle, providers="cpu", threads=1, search="loop")


def _padded(gen: Generator, texts: list[str]) -> np.ndarray:
    return gen._padded([gen.encode(t) for t in texts])


def test_manifest_names_the_files_and_inputs(search_bundle: Path) -> None:
    manifest = json.loads((search_bundle / C.MANIFEST_FILE).read_text())
    entry = manifest["search"]
    assert entry["fp32"]["file"] == "search.onnx" and entry["int8"]["file"] == "search.int8.onnx"
    for precision in ("fp32", "int8"):
        assert entry[precision]["file"] in manifest["files"]  # checksummed
        session = ort.InferenceSession(str(search_bundle / entry[precision]["file"]))
        assert [i.name for i in session.get_inputs()] == [i["name"] for i in entry["inputs"]]
        assert [o.name for o in session.get_outputs()] == [o["name"] for o in entry["outputs"]]
    assert all(spec["meaning"] and spec["dtype"] for spec in entry["inputs"])
    assert entry["fp32"]["shared_initializers"] >= 1  # both graphs' sinusoidal tables
    assert manifest["parity"] == {"skipped": True}


def test_plain_session_reproduces_the_loop_on_a_right_padded_batch(
    search_bundle: Path, loop_gen: Generator
) -> None:
    """Only ids and the documented inputs; rows of mixed lengths, right-padded."""
    src = _padded(loop_gen, TEXTS)
    cfg = loop_gen.config
    session = ort.InferenceSession(str(search_bundle / "search.onnx"))
    sequences, _ = session.run(
        None,
        {
            "input_ids": src.astype(np.int32),
            "max_length": np.array([cfg.max_len + 1], np.int32),
            "min_length": np.array([0], np.int32),
            "num_beams": np.array([4], np.int32),
            "num_return_sequences": np.array([1], np.int32),
            "length_penalty": np.array([1.0], np.float32),
            "repetition_penalty": np.array([1.0], np.float32),
            "attention_mask": (src != cfg.pad_id).astype(np.int32),
        },
    )
    expected = search(loop_gen.step_model, src, GenerationOptions(beam_size=4))
    for row, hyps in zip(sequences[:, 0], expected, strict=True):
        assert row[0] == cfg.bos_id
        got = [int(t) for t in row[1:] if t != -1]  # -1 pads the sequences
        assert tuple(got) == hyps[0].tokens


@pytest.mark.parametrize("options", OPTION_CASES, ids=repr)
def test_generator_graph_path_equals_the_loop(
    graph_gen: Generator, loop_gen: Generator, options: GenerationOptions
) -> None:
    # engine batches small enough for search "auto" to take the graph
    limit = auto_graph_max_hypotheses(graph_gen.config)
    beams = options.beam_size or 1  # unset: greedy, the bundle has no generation defaults
    options = replace(options, batch_size=max(1, min(8, limit // beams)))
    assert graph_gen.uses_graph(options) and not loop_gen.uses_graph(options)
    graph, loop = graph_gen.generate(TEXTS, options), loop_gen.generate(TEXTS, options)
    for g, lp in zip(graph, loop, strict=True):
        assert [c.token_ids for c in g.nbest] == [c.token_ids for c in lp.nbest]
        assert [c.finished for c in g.nbest] == [c.finished for c in lp.nbest]
        assert [c.score for c in g.nbest] == pytest.approx([c.score for c in lp.nbest], abs=1e-4)
        assert g.logprob == pytest.approx(lp.logprob, abs=1e-4)
    if options.max_new_tokens == 3:
        assert any(not c.finished for r in graph for c in r.nbest)  # the case is exercised


def test_auto_takes_the_graph_for_small_engine_batches_only(
    search_bundle: Path, graph_gen: Generator, loop_gen: Generator, monkeypatch
) -> None:
    strict = Generator.load(search_bundle, providers="cpu", threads=1, search="graph")
    # this tiny model's steps are cheap: give it a budget of 8 hypotheses, as g2p-en has
    budget = 8 * step_macs(graph_gen.config)
    monkeypatch.setattr(graph_search, "AUTO_GRAPH_MAX_STEP_MACS", budget)
    limit = auto_graph_max_hypotheses(graph_gen.config)
    assert limit == 8
    for beam in (1, 4):
        options = GenerationOptions(beam_size=beam)
        assert graph_gen.uses_graph(options, limit // beam)
        assert not graph_gen.uses_graph(options, limit // beam + 1)
        assert strict.uses_graph(options, 32) and not loop_gen.uses_graph(options, 1)
    calls = []

    def graph_run(src_ids, options):
        calls.append(src_ids.shape[0])
        raise RuntimeError("the graph ran")

    monkeypatch.setattr(graph_gen.graph_search, "run", graph_run)
    six = TEXTS[:6]  # no empty text: every engine batch has batch_size inputs
    options = GenerationOptions(beam_size=4, batch_size=3)  # 12 hypotheses: the loop
    assert _lists(graph_gen.generate(six, options)) == _lists(loop_gen.generate(six, options))
    assert calls == []
    with pytest.raises(RuntimeError, match="the graph ran"):  # 2 x 4 = 8: the graph
        graph_gen.generate(six, replace(options, batch_size=2))
    assert calls == [2]


def test_auto_rule_follows_the_step_compute() -> None:
    """g2p-en's shape takes the graph up to 8 hypotheses; random-d512's (8,000-token
    vocabulary) only greedy at batch 1-2; a wider or deeper model never more than a narrower."""
    g2p = ModelConfig(src_vocab_size=31, tgt_vocab_size=73, n_decoder_layers=7, d_ff=1024)
    d512 = ModelConfig(
        src_vocab_size=8000, tgt_vocab_size=8000, d_model=512, d_ff=2048, n_decoder_layers=6
    )
    assert step_macs(g2p) == 7 * (6 * 256 * 256 + 2 * 256 * 1024) + 256 * 73
    assert auto_graph_max_hypotheses(g2p) == 8
    assert auto_graph_max_hypotheses(d512) == 2
    assert auto_graph_max_hypotheses(replace(d512, tgt_vocab_size=2000)) == 2
    assert auto_graph_max_hypotheses(replace(d512, d_model=1024, d_ff=4096)) == 0
    deeper = replace(g2p, n_decoder_layers=12)
    assert auto_graph_max_hypotheses(deeper) < auto_graph_max_hypotheses(g2p)
    assert auto_graph_max_hypotheses(d512, "cuda") is None  # no limit on a GPU


def test_auto_takes_the_graph_at_every_batch_size_on_cuda(
    graph_gen: Generator, monkeypatch
) -> None:
    """The rule is the generator's device's: the same bundle on CUDA runs beam 4 at batch
    128 in the graph, where on the CPU (with g2p-en's budget of 8 hypotheses) it runs the
    loop."""
    budget = 8 * step_macs(graph_gen.config)
    monkeypatch.setattr(graph_search, "AUTO_GRAPH_MAX_STEP_MACS", budget)
    options = GenerationOptions(beam_size=4)
    assert not graph_gen.uses_graph(options, 128)
    on_gpu = copy.copy(graph_gen)
    on_gpu.device = "cuda"
    assert on_gpu.uses_graph(options, 128) and on_gpu.uses_graph(GenerationOptions(), 128)
    assert not on_gpu.uses_graph(GenerationOptions(sample=True), 1)  # what it cannot run


def test_ort_format_search_graph_equals_the_loop(search_bundle: Path) -> None:
    manifest = json.loads((search_bundle / C.MANIFEST_FILE).read_text())
    entry = manifest["search"]["ort"]
    assert entry["file"] == "search.ort" and entry["format"] == "ort"
    assert entry["required_operators"] in manifest["files"]
    operators = (search_bundle / entry["required_operators"]).read_text()
    assert "com.microsoft;1;BeamSearch" in operators
    graph = Generator.load(search_bundle, providers="cpu", threads=1, variant="ort")
    loop = Generator.load(search_bundle, "cpu", 1, variant="ort", search="loop")
    assert graph.graph_search is not None
    options = GenerationOptions(beam_size=4, n_best=2)
    got, want = graph.generate(TEXTS, options), loop.generate(TEXTS, options)
    assert [[c.token_ids for c in r.nbest] for r in got] == [
        [c.token_ids for c in r.nbest] for r in want
    ]


def test_int8_search_graph_agrees_with_its_loop(search_bundle: Path) -> None:
    graph = Generator.load(search_bundle, providers="cpu", threads=1, variant="int8")
    loop = Generator.load(search_bundle, "cpu", 1, variant="int8", search="loop")
    assert graph.graph_search is not None
    options = GenerationOptions(beam_size=4)
    same = [
        a.token_ids == b.token_ids
        for a, b in zip(graph.generate(TEXTS, options), loop.generate(TEXTS, options), strict=True)
    ]
    assert sum(same) >= len(TEXTS) - 1


def test_sampling_stays_on_the_loop(graph_gen: Generator, search_bundle: Path) -> None:
    assert not graph_gen.uses_graph(GenerationOptions(sample=True, seed=1))
    strict = Generator.load(search_bundle, providers="cpu", threads=1, search="graph")
    with pytest.raises(OptionsError, match="sampling runs on the Python loop"):
        strict.generate(["abc"], GenerationOptions(sample=True, seed=1))


def test_search_choice_errors(runtime_case, search_bundle: Path) -> None:
    with pytest.raises(BundleError, match=r"no one-graph search variant for 'fp32'.*--variants"):
        Generator.load(runtime_case.bundle, providers="cpu", search="graph")
    with pytest.raises(OptionsError, match="unknown search 'beam'; choose one of auto, graph"):
        Generator.load(search_bundle, providers="cpu", search="beam")
    assert Generator.load(runtime_case.bundle, providers="cpu").graph_search is None  # auto


def test_cli_search_option(runtime_case, search_bundle: Path) -> None:
    runner = CliRunner()
    base = ["generate", "--provider", "cpu", "--threads", "1", "--beam", "4"]
    graph = runner.invoke(cli, [*base, "--search", "graph", str(search_bundle), "abc", "bad"])
    loop = runner.invoke(cli, [*base, "--search", "loop", str(search_bundle), "abc", "bad"])
    assert graph.exit_code == 0 and graph.output == loop.output == "CBA\nDAB\n"
    missing = runner.invoke(cli, [*base, "--search", "graph", str(runtime_case.bundle), "abc"])
    assert isinstance(missing.exception, BundleError) and missing.exit_code == 1
    assert "no one-graph search variant" in str(missing.exception)
    sampled = runner.invoke(cli, ["generate", "--search", "graph", "--sample", str(search_bundle)])
    assert sampled.exit_code == 2 and "--sample and --stream run on the Python loop" in (
        sampled.stderr
    )


def test_parity_group_and_its_failure(
    runtime_model, search_bundle: Path, tmp_path: Path, loop_gen: Generator
) -> None:
    from edgeseq.export.heldout import HeldOut
    from edgeseq.export.kinds.seq2seq.search_parity import (
        search_failure,
        search_parity_group,
        write_search_graphs,
    )
    from edgeseq.export.parity import check_group

    directory = tmp_path / "copy"
    shutil.copytree(search_bundle, directory)
    manifest = json.loads((directory / C.MANIFEST_FILE).read_text())
    texts = [t for t in TEXTS if t] * 5
    held = HeldOut([list(loop_gen.encode(t).ids) for t in texts], texts, "reverse strings")
    cfg = runtime_model.model.cfg
    entry = write_search_graphs(directory, cfg, manifest["variants"])
    precisions = [p for p in ("fp32", "int8") if p in entry]
    group = search_parity_group(
        directory, cfg, runtime_model.tokenizers, precisions, held, cfg.max_len
    )
    assert entry["fp32"]["file"] == "search.onnx" and group["passed"]
    cases = {(r["beam_size"], r["batch"]) for r in group["fp32"]["rows"]}
    assert cases == {(1, 1), (1, 32), (4, 1), (4, 32)}
    assert all(r["identical"] == r["inputs"] == len(texts) for r in group["fp32"]["rows"])
    assert 0.8 <= group["int8"]["agreement_with_fp32"] <= 1.0
    rows = search_parity_rows(group)
    assert ("4", "fp32 search graph = loop, beam 4, batch 32", "35/35", "ok") in rows
    report = {"passed": True, "search": group}
    check_group(report, "search", search_failure)  # passes quietly
    bad = json.loads(json.dumps(group))
    bad["passed"] = False
    row = bad["fp32"]["rows"][2]
    row["identical"] -= 1
    row["mismatches"] = [{"index": 3, "loop_ids": [5, 4], "graph_ids": [5]}]
    with pytest.raises(ParityError, match=r"beam 4 batch 1: 34/35 identical; input #3: loop"):
        check_group({"passed": False, "search": bad}, "search", search_failure)


def test_bench_times_the_graph_path_next_to_the_loop(search_bundle: Path, loop_gen) -> None:
    from edgeseq.bench.graph_worker import graph_jobs, graph_lines, graph_vs_loop, measure_graph
    from edgeseq.bench.ort_worker import measure_ort
    from edgeseq.runtime.bundle import load_bundle
    from edgeseq.runtime.search_timing import BenchSpec

    bundle = load_bundle(search_bundle)
    every = {"ort:search-fp32", "ort:search-int8", "ort:search-ort"}
    assert set(graph_jobs(bundle, None, "cpu", "all")) == every
    assert set(graph_jobs(bundle, ["fp32"], "cpu", "all")) == {"ort:search-fp32"}
    sources = [list(loop_gen.encode(t).ids) for t in TEXTS]
    spec = BenchSpec(sources, (1, 4), repeats=1, threads=1, beam_size=2)
    graph = measure_graph(search_bundle, "fp32", spec, "cpu", "all")
    loop = measure_ort(search_bundle, "fp32", spec)
    assert graph["engine"] == "onnxruntime fp32 search graph"
    for batch in ("1", "4"):  # the same work: the same best hypotheses
        assert graph["batches"][batch]["tokens"] == loop["batches"][batch]["tokens"]
    ratios = graph_vs_loop([{"ort:search-fp32": graph, "ort:fp32": loop}])
    assert set(ratios["search-fp32"]) == {"1", "4"}
    assert all(value > 0 for value in ratios["search-fp32"].values())
    [line] = graph_lines({"graph_vs_loop": ratios})
    assert line.startswith("- search-fp32 (one session.run per batch) vs the fp32 loop: ")


def test_verify_reruns_the_search_group(runtime_model, search_bundle: Path, tmp_path: Path):
    from edgeseq.build_model.checkpoint import save_checkpoint
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import verify_bundle

    task = {"name": "reverse", "options": {}}
    ckpt = save_checkpoint(
        tmp_path / "ckpt", runtime_model.model, runtime_model.tokenizers, task, {"step": 0}
    )
    report = verify_bundle(search_bundle, ckpt, ExportOptions(inputs=40))
    assert report["passed"] and report["search"]["passed"]
    assert set(report["search"]) >= {"fp32", "int8", "ort"}
    assert all(r["inputs"] == 40 for r in report["search"]["fp32"]["rows"])


# Beams hitting the step budget: onnxruntime keeps num_beams hypotheses ranked by its own
# score, in which an open one counts one length unit more than in the loop (issue 39, item 3).
AT_THE_BUDGET = [
    GenerationOptions(beam_size=beam, n_best=beam, max_new_tokens=budget, length_penalty=penalty)
    for beam in (4, 6)
    for budget in (3, 4, 8)
    for penalty in (1.0, 2.0, -0.5)
]


def _lists(results) -> list[list[tuple[int, ...]]]:
    return [[c.token_ids for c in r.nbest] for r in results]


def test_the_graph_flags_every_list_the_loop_ranks_otherwise(
    search_bundle: Path, graph_gen: Generator, loop_gen: Generator
) -> None:
    strict = Generator.load(search_bundle, providers="cpu", threads=1, search="graph")
    run = [t for t in TEXTS if t]  # what generate runs ("" is skipped)
    differ = 0
    for options in AT_THE_BUDGET:
        _, unsure = strict.graph_search.run(_padded(loop_gen, run), options)
        graph, loop = strict.generate(TEXTS, options), loop_gen.generate(TEXTS, options)
        for text, g, lp in zip(TEXTS, graph, loop, strict=True):
            if _lists([g]) != _lists([lp]):
                differ += 1
                assert unsure[run.index(text)], (options, text)
                dropped = {c.token_ids for c in lp.nbest} - {c.token_ids for c in g.nbest}
                if options.length_penalty > 0:  # what onnxruntime dropped: a finished one
                    assert any(c.finished for c in lp.nbest if c.token_ids in dropped)
        assert _lists(graph_gen.generate(TEXTS, options)) == _lists(loop)  # auto: the loop's
    assert differ >= 3  # the case is exercised


def test_lists_ended_before_the_budget_are_certain(graph_gen: Generator) -> None:
    options = GenerationOptions(beam_size=4, n_best=4)
    _, unsure = graph_gen.graph_search.run(_padded(graph_gen, TEXTS[:3]), options)
    assert unsure == [False, False, False]
