"""Everything downstream of an import works unchanged on an imported bundle (issues 37 and
45): the variants gated on the user's --data, `edgeseq generate` through every variant and the
search graph, `edgeseq evaluate --data`, `edgeseq serve`, and `edgeseq bench --checkpoint
SOURCE`.

The bundles are session fixtures in conftest.py: tests/import_cases.py's tiny MarianMT trained
to copy words (SentencePiece Unigram vocabulary) and the tutorial-shaped `nn.Transformer`
example; tests/family_cases.py's copy-trained M2M-100 (NLLB layout), mBART-50, BART and T5
v1.1. The models with a language list (M2M-100, mBART-50) force the target language, which
the search graph cannot: export refuses `search` for them and `generate --search graph` says
to use 'auto'. The edge targets (ARM64, the browser) are in tests/test_edge.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli
from edgeseq.runtime.errors import EdgeseqError, OptionsError

QUICK = ["--repeats", "1", "--batch-sizes", "1,2", "--inputs", "4", "--max-new-tokens", "6"]
# The fixture of each imported Hugging Face model -> its adapter's name.
HF_IMPORTS = {
    "marian_import": "marian",
    "m2m_import": "m2m_100",
    "mbart50_import": "mbart",
    "bart_import": "mbart",
    "t5_import": "t5",
}
LANGUAGE_IMPORTS = ("m2m_import", "mbart50_import")  # a target language forced: no search graph


def inputs_of(case: dict[str, Any]) -> list[str]:
    """The inputs of a case's --data file (the text before each line's TAB)."""
    lines = case["data"].read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0] for line in lines]


def cli_generate(bundle: Path, texts: list[str], *flags: str) -> list[dict[str, Any]]:
    """`edgeseq generate BUNDLE --json FLAGS TEXTS...`: one JSON object per input."""
    result = CliRunner().invoke(cli, ["generate", str(bundle), "--json", *flags, "--", *texts])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(params=sorted(HF_IMPORTS))
def hf_import(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Each imported Hugging Face model's case, with "name": its fixture's name."""
    return {"name": request.param, **request.getfixturevalue(request.param)}


def test_every_variant_was_gated_on_the_users_data(hf_import) -> None:
    manifest = json.loads((hf_import["bundle"] / "manifest.json").read_text("utf-8"))
    assert sorted(manifest["variants"]) == ["fp16", "fp32", "int8", "ort"]
    for name in ("int8", "fp16", "ort"):
        gate = manifest["variants"][name]["gate"]
        assert gate["passed"] and gate["metric"] == "wer", name  # references: the error rate
        assert gate["source"] == "data.tsv: 20 inputs" and gate["inputs"] == 20, name
    if hf_import["name"] in LANGUAGE_IMPORTS:
        assert "search" not in manifest
    else:
        assert {"fp32", "int8", "ort"} <= set(manifest["search"])  # one-graph search variants
    assert manifest["parity"]["source"]["passed"]
    source_level3 = manifest["parity"]["source"]["level3"]
    assert source_level3["source"] == "data.tsv: 20 inputs"
    assert source_level3["greedy"]["identical"] == source_level3["greedy"]["inputs"] == 20


def test_generate_runs_every_variant_and_the_search_graph(hf_import) -> None:
    bundle, texts = hf_import["bundle"], inputs_of(hf_import)
    loop = [row["output"] for row in cli_generate(bundle, texts, "--search", "loop")]
    assert len(loop) == 20 and len(set(loop)) >= 10  # the copy model: outputs follow inputs
    for variant in ("int8", "fp16", "ort"):
        rows = cli_generate(bundle, texts, "--variant", variant, "--search", "loop")
        # the T5 copy model runs a few words on to max_len (so does fp32)
        assert len(rows) == 20 and sum(row["finished"] for row in rows) >= 16, variant
    refused = {
        "m2m_import": "a language list has none (it cannot force the target language): choose",
        "mbart50_import": "a language list has none (it cannot force the target language): choose",
        "bart_import": "token rules (bans, forced </s>)",  # generation_config's forced_eos
    }.get(hf_import["name"])
    if refused:
        args = ["generate", str(bundle), "--search", "graph", "--", *texts]
        result = CliRunner().invoke(cli, args)
        assert isinstance(result.exception, EdgeseqError), result.output
        assert refused in str(result.exception) and "'auto'" in str(result.exception)
        assert [row["output"] for row in cli_generate(bundle, texts)] == loop  # auto: the loop
    if hf_import["name"] in LANGUAGE_IMPORTS:
        return
    rules = ["--no-forced-eos"] if refused else []  # the graph runs without the token rule
    graph = cli_generate(bundle, texts, *rules, "--search", "graph")
    looped = cli_generate(bundle, texts, *rules, "--search", "loop")
    assert [row["output"] for row in graph] == [row["output"] for row in looped]
    beam = ("--beam", "4", *rules)
    graph4 = cli_generate(bundle, texts, *beam, "--search", "graph")
    loop4 = cli_generate(bundle, texts, *beam, "--search", "loop")
    assert [r["ids"] for r in graph4] == [r["ids"] for r in loop4]


def test_evaluate_data_scores_what_generate_outputs(hf_import) -> None:
    from edgeseq.runtime.scoring import task_scores

    bundle, data = hf_import["bundle"], hf_import["data"]
    rows = [line.split("\t") for line in data.read_text("utf-8").splitlines()]
    for flags in ([], ["--beam", "4"], ["--variant", "int8"]):
        args = ["evaluate", str(bundle), "--data", str(data), "--json", *flags]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        scored = json.loads(result.stdout.strip().splitlines()[-1])
        outputs = [row["output"] for row in cli_generate(bundle, [s for s, _ in rows], *flags)]
        want = task_scores(outputs, [[ref] for _, ref in rows], None)
        assert {key: scored[key] for key in want} == pytest.approx(want), flags
        assert scored["count"] == 20


def test_serve_answers_what_generate_outputs(hf_import) -> None:
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    from serve_client import generate, running

    from edgeseq.runtime.generator import Generator
    from edgeseq.runtime.serve.app import create_app
    from edgeseq.runtime.serve.batcher import BatchSettings

    bundle, texts = hf_import["bundle"], inputs_of(hf_import)
    generator = Generator.load(bundle, providers="cpu", threads=1)
    app = create_app(generator, BatchSettings(max_batch=32, max_wait_ms=20, workers=1))
    with running(app) as port:
        answers = [generate(port, texts, options) for options in ({}, {"beam_size": 4})]
    for (status, body), flags in zip(answers, ([], ["--beam", "4"]), strict=True):
        assert status == 200, body
        want = cli_generate(bundle, texts, *flags)
        got = body["results"]
        assert [(r["input"], r["output"], r["ids"]) for r in got] == [
            (r["input"], r["output"], r["ids"]) for r in want
        ]
        assert [r["score"] for r in got] == pytest.approx([r["score"] for r in want], abs=1e-5)


@pytest.mark.parametrize("case", [*sorted(HF_IMPORTS), "torch_import"])
def test_bench_times_pytorch_on_the_imported_source(
    request: pytest.FixtureRequest, case: str, tmp_path: Path
) -> None:
    """`edgeseq bench BUNDLE --checkpoint SOURCE`: PyTorch eager on the adapter's module
    (the source's weights), next to onnxruntime fp32, the same tokens at every batch size."""
    imported = request.getfixturevalue(case)
    words = tmp_path / "inputs.txt"
    words.write_text("\n".join(inputs_of(imported)) + "\n", encoding="utf-8")
    out = tmp_path / "bench.json"
    args = ["bench", str(imported["bundle"]), "--checkpoint", str(imported["source"]), *QUICK]
    args += ["--variant", "fp32", "--input", str(words), "--json", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    torch_run = next(e for e in report["engines"] if e["kind"] == "pytorch")
    assert torch_run["source"] == HF_IMPORTS.get(case, "torch")
    assert torch_run["file_bytes"] > 0 and torch_run["files"] and torch_run["load_s"] > 0
    for batch in ("1", "2"):
        assert report["ratios"]["fp32"][batch]["same_tokens"] is True  # fp32 = PyTorch's work
        assert report["ratios"]["fp32"][batch]["tokens_per_s"] > 0
    assert "edgeseq's PyTorch module holding the weights of" in result.stdout


def test_bench_refuses_a_checkpoint_no_adapter_reads(marian_import, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model", encoding="utf-8")
    args = ["bench", str(marian_import["bundle"]), "--checkpoint", str(tmp_path), *QUICK]
    result = CliRunner().invoke(cli, args)
    assert isinstance(result.exception, OptionsError), result.output
    assert f"--checkpoint {tmp_path} is not a model edgeseq reads" in str(result.exception)
    assert "a Hugging Face MarianMT directory" in str(result.exception)


@pytest.mark.parametrize("case", LANGUAGE_IMPORTS)
def test_export_refuses_the_search_graph_of_a_model_with_languages(
    request: pytest.FixtureRequest, case: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from edgeseq.cli.main import main

    source, out = request.getfixturevalue(case)["source"], tmp_path / "bundle"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["export", str(source), "--out", str(out), "--variants", "fp32,search"])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count("\n") == 1 and err.startswith("error: ")
    assert f"--variants search: {HF_IMPORTS[case]} models start every output" in err
    assert "leave search out of --variants" in err
    assert not out.exists()
