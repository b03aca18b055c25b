"""GPT and BERT bundles in the torch-free runtime: the GPT step adapter against a plain numpy
loop over the graph and against PyTorch, the API and the CLI agreeing, BERT labels,
probabilities and embeddings, options that do not apply, inspect and bench, and
onnxruntime-genai's greedy output equal to `edgeseq generate`'s."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from edgeseq.cli.main import cli, main
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.kinds.decoder_only import GPTGenerator
from edgeseq.runtime.kinds.encoder_only import BertClassifier
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import GenerationOptions, greedy_search

PROMPTS = ["photo", "inter", "", "str", "qu", "bacteriophage"]


def _cli(*args: str) -> Any:
    """A successful edgeseq command (its stdout is `.stdout`)."""
    argv = [*args, "--threads", "1"] if args[0] != "inspect" else list(args)
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def gpt(gpt_case: dict[str, Any]) -> GPTGenerator:
    generator = Generator.load(gpt_case["bundle"], providers="cpu", threads=1)
    assert isinstance(generator, GPTGenerator)
    return generator


@pytest.fixture(scope="module")
def bert(bert_case: dict[str, Any]) -> BertClassifier:
    classifier = Generator.load(bert_case["bundle"], providers="cpu", threads=1)
    assert isinstance(classifier, BertClassifier)
    return classifier


def test_gpt_adapter_equals_numpy_loop_and_torch(gpt: GPTGenerator, gpt_case) -> None:
    """Greedy through OrtGPTStep and runtime/search.py == export's numpy loop over the same
    graph == TorchGPTStep over the checkpoint, for a batch of prompts of different lengths
    and the empty prompt."""
    from edgeseq.build_model.checkpoint import load_checkpoint
    from edgeseq.build_model.decoder_only import TorchGPTStep
    from edgeseq.export.kinds.decoder_only import greedy_loop
    from edgeseq.export.kinds.one_graph import session_run

    cfg = gpt.config
    prompts = [gpt.tokenizers.source.encode(p) for p in PROMPTS]
    budget = cfg.max_len - 1 - max(len(p) for p in prompts)
    batch = right_pad(prompts, cfg.pad_id)
    ours = greedy_search(gpt.step_model, batch, budget)
    loop, _, _ = greedy_loop(session_run(gpt.step_model.session), cfg, prompts, budget)
    model, _, _ = load_checkpoint(gpt_case["run"])
    torch_ids = greedy_search(TorchGPTStep(model), batch, budget)
    assert ours == loop == torch_ids
    alone = [greedy_search(gpt.step_model, right_pad([p], cfg.pad_id), budget)[0] for p in prompts]
    assert alone == ours  # a continuation does not depend on the other prompts of its batch


def test_gpt_api_and_cli_agree(gpt: GPTGenerator, gpt_case) -> None:
    results = gpt.generate(PROMPTS)
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.text == prompt + gpt.tokenizers.target.decode(list(result.token_ids))
        assert not result.skipped
    out = _cli("generate", str(gpt_case["bundle"]), *PROMPTS)
    assert out.stdout.splitlines() == [r.text for r in results]
    streamed = _cli("generate", str(gpt_case["bundle"]), "--stream", *PROMPTS)
    assert streamed.stdout.splitlines() == [r.text for r in results]
    upper = gpt.generate(["PHOTO"])[0]  # the words task keeps case: no capital is known
    assert upper.skipped == "unknown" and upper.text == ""


def test_gpt_beam_and_sampling(gpt: GPTGenerator) -> None:
    greedy = gpt.generate(PROMPTS)
    beam = gpt.generate(PROMPTS, GenerationOptions(beam_size=4, n_best=3))
    for prompt, result in zip(PROMPTS, beam, strict=True):
        assert len(result.nbest) == 3 and all(c.text.startswith(prompt) for c in result.nbest)
        assert [c.score for c in result.nbest] == sorted((c.score for c in result.nbest),
                                                         reverse=True)  # fmt: skip
    one = gpt.generate(PROMPTS, GenerationOptions(beam_size=1, length_penalty=0.0))
    assert [r.text for r in one] == [r.text for r in greedy]
    sampled = GenerationOptions(sample=True, seed=7, temperature=1.5)
    first, again = gpt.generate(PROMPTS, sampled), gpt.generate(PROMPTS, sampled)
    assert [r.text for r in first] == [r.text for r in again]
    short = gpt.generate(["photo"], GenerationOptions(max_new_tokens=1))[0]
    assert len(short.token_ids) <= 1


def test_gpt_prompt_rules(gpt: GPTGenerator) -> None:
    from edgeseq.runtime.errors import InputTooLongError

    limit = gpt.config.max_len - 2
    with pytest.raises(InputTooLongError, match=f"leaves room for {limit}"):
        gpt.generate(["a" * (limit + 1)])
    [cut] = gpt.generate(["b" + "a" * limit], GenerationOptions(truncate=True))
    assert cut.source.truncated and cut.text.startswith("a" * limit)  # the end is kept
    [skipped] = gpt.generate(["😀"])
    assert skipped.skipped == "unknown" and skipped.text == ""
    with pytest.raises(OptionsError, match="no one-graph search variant"):
        Generator.load(gpt.bundle.path, providers="cpu", search="graph")


def test_bert_labels_probabilities_and_cli(bert: BertClassifier, bert_case) -> None:
    texts = ["banana", "photograph", "", "university"]
    predictions = bert.predict(texts)
    results = bert.generate(texts)
    assert predictions[2] is None and results[2].skipped == "empty"
    labels = {bert.tokenizers.target.decode([i]) for i in range(4, bert.config.tgt_vocab_size)}
    for prediction, result in zip(predictions, results, strict=True):
        if prediction is None:
            continue
        assert prediction.label == result.text and prediction.label in labels
        assert abs(sum(prediction.probabilities.values()) - 1) < 1e-6
        assert np.isclose(np.exp(result.logprob), prediction.probability)
        assert [c.text for c in result.nbest] == list(prediction.probabilities)
    out = _cli("generate", str(bert_case["bundle"]), *texts)
    assert out.stdout.splitlines() == [r.text for r in results]
    rows = _cli("generate", str(bert_case["bundle"]), "--json", "banana").stdout
    row = json.loads(rows)
    assert row["output"] == results[0].text and len(row["nbest"]) == len(labels)


def test_bert_embeddings_equal_torch_mean_pooling(bert: BertClassifier, bert_case) -> None:
    import torch

    from edgeseq.build_model.checkpoint import load_checkpoint

    texts = ["banana", "photograph", "a"]
    pooled = bert.embed(texts)
    tokens = bert.embed(texts, per_token=True)
    assert pooled.shape == (3, bert.config.d_model) and pooled.dtype == np.float32
    assert [t.shape for t in tokens] == [(len(t) + 1, bert.config.d_model) for t in texts]
    model, _, _ = load_checkpoint(bert_case["run"])
    for text, vector, per_token in zip(texts, pooled, tokens, strict=True):
        ids = torch.tensor([[*bert.tokenizers.source.encode(text), bert.config.eos_id]])
        with torch.no_grad():
            hidden, _ = model.eval().encode(ids, ids != bert.config.pad_id)
        np.testing.assert_allclose(per_token, hidden[0].numpy(), atol=1e-4)
        np.testing.assert_allclose(vector, hidden[0].mean(0).numpy(), atol=1e-4)
    assert not bert.embed([""]).any()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--beam", "2"), "beam search, sampling and max_new_tokens do not apply"),
        (("--sample",), "beam search, sampling and max_new_tokens do not apply"),
        (("--stream",), "streaming does not apply"),
        (("--search", "graph"), "no one-graph search variant"),
    ],
)
def test_bert_refuses_options_that_do_not_apply(bert_case, flags, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["generate", str(bert_case["bundle"]), "banana", *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and message in err and len(err.splitlines()) == 1


def test_inspect_and_bench_both_kinds(gpt_case, bert_case) -> None:
    for case, word, rate in ((gpt_case, "GPT", "tokens/s"), (bert_case, "BERT", "sequences/s")):
        shown = _cli("inspect", str(case["bundle"])).stdout
        assert f"{word}, 2 layers" in shown and "check: ok" in shown
        timed = _cli("bench", str(case["bundle"]), "--inputs", "8", "--repeats", "1").stdout
        assert rate in timed and "| int8 | cpu |" in timed


def test_onnxruntime_genai_equals_edgeseq_generate(gpt: GPTGenerator, gpt_case) -> None:
    og = pytest.importorskip(
        "onnxruntime_genai", reason="onnxruntime-genai not installed (make test installs it)"
    )
    cfg = gpt.config
    model = og.Model(str(gpt_case["bundle"]))
    out = _cli("generate", str(gpt_case["bundle"]), "--json", *PROMPTS)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    for prompt, row in zip(PROMPTS, rows, strict=True):
        ids = gpt.tokenizers.source.encode(prompt)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=cfg.max_len, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([[cfg.bos_id, *ids]], dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        got = [int(t) for t in generator.get_sequence(0)][1 + len(ids) :]
        assert [t for t in got if t != cfg.eos_id] == row["ids"], prompt


def test_serve_answers_gpt_and_bert_like_the_api(gpt: GPTGenerator, bert: BertClassifier) -> None:
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    from serve_client import generate, running

    from edgeseq.runtime.results import result_json
    from edgeseq.runtime.serve.app import create_app

    for model, texts, options in (
        (gpt, PROMPTS, {"beam_size": 2}),
        (bert, ["banana", "photograph"], {}),
    ):
        with running(create_app(model)) as port:
            status, body = generate(port, texts, options)
        assert status == 200, body
        results = model.generate(texts, GenerationOptions(**options))
        target = model.tokenizers.target
        pairs = enumerate(zip(texts, results, strict=True), start=1)
        want = [result_json(i, text, result, target) for i, (text, result) in pairs]
        assert body["results"] == want
