"""Importing a Hugging Face M2M-100 / NLLB checkpoint (export/sources/m2m_100.py): logits,
cached steps and the source's own greedy and beam-4 generate with the forced target language,
the tokenizer's ids, the bundle's languages through the CLI, the API and server batching, a
default target language (export and serve --target-lang), and what the adapter refuses (one
`error:` line, exit 1, nothing at --out)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the M2M-100 importer needs the hf extra")
pytest.importorskip("sentencepiece", reason="the test trains a SentencePiece model")

from click.testing import CliRunner
from hf_fixtures import synthetic_corpus
from m2m_fixtures import EXTRA_ROWS, LANGUAGES, TARGET, build_m2m_dir
from safetensors.torch import load_file
from transformers import AutoTokenizer, M2M100ForConditionalGeneration

from edgeseq.build_model.torch_step import TorchStep
from edgeseq.cli.main import cli, main
from edgeseq.export.sources import SourceError
from edgeseq.export.sources.m2m_100 import detect, load
from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.prefix import ForcedPrefix
from edgeseq.runtime.search import GenerationOptions, beam_search, greedy_search
from edgeseq.runtime.serve.batcher import BatchSettings, run_merged
from edgeseq.runtime.serve.continuous import StepBatcher, steps_decoder

MAX_NEW = 20
TEXTS = ["Straße naïve façade", "the quick brown fox", "λόγος", "Hello world, 42!"]


@pytest.fixture(scope="module")
def nllb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_m2m_dir(tmp_path_factory.mktemp("m2m") / "nllb-tiny", copy_steps=200)


@pytest.fixture(scope="module")
def source(nllb_dir: Path) -> Any:
    return load(nllb_dir)


@pytest.fixture(scope="module")
def bundle(nllb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("m2m") / "bundle"
    args = ["export", str(nllb_dir), "--out", str(out), "--variants", "fp32,steps"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return out


def inputs(source: Any) -> list[list[int]]:
    """24 corpus words and TEXTS as sources `[eng_Latn] tokens </s>`, edgeseq ids."""
    words = dict.fromkeys(line.split()[0] for line in synthetic_corpus("source", 60, seed=7))
    eng = source.languages["codes"]["eng_Latn"]
    return [[eng, *source.tokenizers.source.encode(t), 2] for t in [*list(words)[:24], *TEXTS]]


def test_config_rows_and_languages(nllb_dir: Path, source: Any) -> None:
    assert detect(nllb_dir) and not detect(nllb_dir.parent) and source.adapter == "m2m_100"
    cfg = source.model.cfg
    hf = json.loads((nllb_dir / "config.json").read_text())
    assert (cfg.src_vocab_size, cfg.tgt_vocab_size) == (hf["vocab_size"],) * 2
    assert (cfg.positional, cfg.norm, cfg.has_final_norm, cfg.scale_embedding) == (
        "learned", "pre", True, True,
    )  # fmt: skip
    assert cfg.tie_output and not cfg.has_output_bias  # one table: embedding and output
    shared = load_file(str(nllb_dir / "model.safetensors"))["model.shared.weight"]
    model = source.model
    assert torch.equal(model.src_embed.weight[0], shared[1])  # <pad> and <s> swapped
    assert torch.equal(model.src_embed.weight[1], shared[0])
    assert torch.equal(model.tgt_embed.weight[1], shared[0])  # <s> keeps its row, and
    assert cfg.start_id == cfg.eos_id == 2  # decoding starts from </s>, as the source's
    assert torch.equal(model.output.weight[1], shared[0])
    assert torch.equal(model.output.weight[4:], shared[4:])
    languages = source.languages
    assert sorted(languages["codes"]) == sorted(LANGUAGES)
    assert (languages["default_source"], languages["default_target"]) == ("eng_Latn", TARGET)
    assert source.tokenizers.source.vocab_size == hf["vocab_size"]  # EXTRA_ROWS padded
    assert f"{EXTRA_ROWS} embedding rows without a token" in source.description
    assert "ids equal to transformers' on 7/7" in source.description


def test_logits_and_cached_steps_equal_the_source(source: Any) -> None:
    """Levels 1 and 2 against M2M100ForConditionalGeneration itself."""
    rng = np.random.default_rng(0)
    src = right_pad(inputs(source)[:8], 0)
    tgt = right_pad([[2, *rng.integers(4, 500, n).tolist()] for n in (5, 1, 8, 3) * 2], 0)
    want = source.reference.logits(src, tgt).numpy()
    model, src_t, tgt_t = source.model, torch.as_tensor(src), torch.as_tensor(tgt)
    with torch.no_grad():
        full = model(src_t, tgt_t).numpy()
        state, step, steps = None, TorchStep(model), []
        state = step.start(src)
        for t in range(tgt.shape[1]):
            logits, state = step.step(state, tgt[:, t : t + 1])
            steps.append(logits[:, 0])
    real = tgt != 0
    assert np.abs(full[real] - want[real]).max() < 1e-4
    assert np.abs(np.stack(steps, axis=1)[real] - want[real]).max() < 1e-4


@pytest.mark.parametrize("language", [TARGET, "deu_Latn"])
def test_greedy_and_beam_equal_the_sources_generate(source: Any, language: str) -> None:
    """Level 3: the source's generate with forced_bos_token_id vs edgeseq's search forcing the
    same language token (runtime/prefix.py), greedy and beam 4."""
    lang = source.languages["codes"][language]
    sources = inputs(source)
    ref = source.reference
    reference = type(ref)(ref.path, ref.model_class, (lang,))
    step, src = ForcedPrefix(TorchStep(source.model), [[lang]]), right_pad(sources, 0)
    greedy = greedy_search(step, src, MAX_NEW)
    beam = [list(h[0].tokens) for h in beam_search(step, src, 4, MAX_NEW)]
    assert reference.generate(sources, 1, MAX_NEW) == greedy
    assert reference.generate(sources, 4, MAX_NEW) == beam
    assert all(ids[0] == lang for ids in greedy + beam)
    if language == TARGET:  # the trained direction: varied lengths, greedy != beam
        assert len({len(ids) for ids in greedy + beam}) > 3 and greedy != beam


def test_tokenizer_gives_the_sources_ids(nllb_dir: Path, source: Any) -> None:
    hf = AutoTokenizer.from_pretrained(nllb_dir, src_lang="deu_Latn")
    ours, deu = source.tokenizers.source, source.languages["codes"]["deu_Latn"]
    lines = synthetic_corpus("target", 2000, seed=3)
    swap = {0: 1, 1: 0}
    matched = sum(
        [swap.get(i, i) for i in hf(text).input_ids] == [deu, *ours.encode(text), 2]
        for text in lines
    )
    assert matched == len(lines)
    ids = hf(lines[:50]).input_ids
    assert [ours.decode([swap.get(i, i) for i in row]) for row in ids] == hf.batch_decode(
        ids, skip_special_tokens=True
    )


def test_bundle_generate_cli_api_and_server(bundle: Path, nllb_dir: Path) -> None:
    config = json.loads((bundle / "config.json").read_text())
    assert config["languages"]["default_target"] == TARGET
    manifest = json.loads((bundle / "manifest.json").read_text())
    group = manifest["parity"]["source"]
    assert group["passed"] and group["level3"]["beam"]["identical"] > 0
    gen = Generator.load(bundle)
    hf = AutoTokenizer.from_pretrained(nllb_dir, src_lang="eng_Latn")
    model = M2M100ForConditionalGeneration.from_pretrained(nllb_dir).eval()
    for language in (TARGET, "deu_Latn"):
        batch = hf(TEXTS, return_tensors="pt", padding=True)
        lang = hf.convert_tokens_to_ids(language)
        out = model.generate(**batch, forced_bos_token_id=lang, max_new_tokens=MAX_NEW)
        want = hf.batch_decode(out, skip_special_tokens=True)
        opts = GenerationOptions(max_new_tokens=MAX_NEW, target_lang=language)
        assert [r.text for r in gen.generate(TEXTS, opts)] == want
        args = ["generate", str(bundle), *TEXTS, "--max-new-tokens", str(MAX_NEW)]
        result = CliRunner().invoke(cli, [*args, "--target-lang", language])
        assert result.exit_code == 0 and result.stdout.splitlines() == want, result.output
    # Requests with different target languages merged by the server's batcher: each its own.
    fra, deu = (
        GenerationOptions(max_new_tokens=MAX_NEW, target_lang=c) for c in (TARGET, "deu_Latn")
    )
    merged = run_merged(gen, [(TEXTS, fra), (TEXTS, deu), (TEXTS[:2], fra)], 32)
    assert [[r.text for r in rs] for rs in merged] == [
        [r.text for r in gen.generate(texts, o)]
        for texts, o in ((TEXTS, fra), (TEXTS, deu), (TEXTS[:2], fra))
    ]
    with pytest.raises(
        OptionsError, match="target language 'xx_Latn' is not one of this model's: deu_Latn"
    ):
        gen.generate(["a"], GenerationOptions(target_lang="xx_Latn"))


def test_step_batching_mixes_languages(bundle: Path) -> None:
    """Requests with different source and target languages and prefixes, and the defaults, in
    one step batch: each gets what `generate` gives it alone."""
    gen = Generator.load(bundle, providers="cpu", threads=1)
    steps = steps_decoder(gen, "step")
    assert steps is not None
    batcher = StepBatcher(gen, steps, BatchSettings(max_batch=8, max_wait_ms=50))
    requests = [
        GenerationOptions(max_new_tokens=MAX_NEW),
        GenerationOptions(max_new_tokens=MAX_NEW, target_lang="deu_Latn"),
        GenerationOptions(max_new_tokens=MAX_NEW, source_lang="zho_Hans", target_lang=TARGET),
        GenerationOptions(max_new_tokens=MAX_NEW, target_lang="deu_Latn", target_prefix="the"),
        GenerationOptions(max_new_tokens=7, target_prefix="the quick"),
    ]
    batcher.start()
    try:
        futures = [batcher.submit(TEXTS, options, timeout_s=60) for options in requests]
        got = [future.result(timeout=120) for future in futures]
    finally:
        batcher.close()
    for results, options in zip(got, requests, strict=True):
        want = gen.generate(TEXTS, options)
        assert [(r.token_ids, r.text) for r in results] == [(w.token_ids, w.text) for w in want]
        assert [r.logprob for r in results] == pytest.approx([w.logprob for w in want], abs=1e-4)
    assert got[0][0].token_ids[0] == gen.target_prefix(gen.resolve(requests[0]))[0]
    assert [r.text for r in got[1]] != [r.text for r in got[0]]


def test_unknown_language_is_one_error_line(bundle: Path, capsys: pytest.CaptureFixture) -> None:
    code, err = run_main(["generate", str(bundle), "a", "--target-lang", "klingon"], capsys)
    assert code == 1 and err == (
        "error: target language 'klingon' is not one of this model's: "
        "deu_Latn, eng_Latn, fra_Latn, zho_Hans\n"
    )


def run_main(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """`edgeseq ARGV` as the console runs it: (exit code, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code), capsys.readouterr().err


def test_bundle_without_languages_refuses_them(tmp_path: Path) -> None:
    gen = Generator.load("g2p-en")
    with pytest.raises(OptionsError, match="no language list: drop --target-lang"):
        gen.generate(["hello"], GenerationOptions(target_lang="fra_Latn"))


def _export_fails(
    path: Path, out: Path, match: str, capsys: pytest.CaptureFixture, *more: str
) -> None:
    code, err = run_main(["export", str(path), "--out", str(out), *more], capsys)
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert match in lines[0] and not out.exists()


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"activation_function": "tanh"}, "activation_function 'tanh' is not mapped"),
        ({"decoder_ffn_dim": 48}, "encoder_ffn_dim != decoder_ffn_dim"),
        ({"decoder_start_token_id": 0}, "decoder_start_token_id 0 is not </s>"),
        ({"vocab_size": 300}, "the tokenizer has 506 ids but the model's embedding has 300"),
    ],
)
def test_refuses_what_does_not_map(
    nllb_dir: Path,
    tmp_path: Path,
    changes: dict[str, Any],
    match: str,
    capsys: pytest.CaptureFixture,
) -> None:
    path = tmp_path / "changed"
    shutil.copytree(nllb_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))
    _export_fails(path, tmp_path / "out", match, capsys)


def test_refuses_another_model_type(
    nllb_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "bart"
    shutil.copytree(nllb_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"model_type": "bart"}))
    with pytest.raises(SourceError, match="model_type is 'bart'; the m2m_100 adapter reads"):
        load(path)
    _export_fails(path, tmp_path / "out", "model_type is 'bart'", capsys, "--source", "m2m_100")


def test_a_generated_bos_is_fed_back_as_the_source_feeds_it(
    nllb_dir: Path, source: Any, tmp_path: Path
) -> None:
    """The source starts decoding from </s>; a <s> it generates mid-output is embedded as
    <s> (the bundle's decoder_start_id is </s>, not a <s> row swapped for it). The checkpoint
    is changed so that <s> outscores the token greedy search picks most often."""
    sources = inputs(source)
    lang = source.languages["codes"][TARGET]
    step, src = ForcedPrefix(TorchStep(source.model), [[lang]]), right_pad(sources, 0)
    counts = np.bincount([t for ids in greedy_search(step, src, MAX_NEW) for t in ids[1:]])
    common = int(counts.argmax())  # in edgeseq ids: 0/1 swapped, others the source's
    changed = tmp_path / "bos-emitting"
    shutil.copytree(nllb_dir, changed)
    weights = load_file(str(changed / "model.safetensors"))
    for key in weights:
        if key.endswith("shared.weight") or key.endswith("embed_tokens.weight"):
            weights[key][0] = 1.3 * weights[key][common]  # the source's <s> (tied output)
    from safetensors.torch import save_file

    save_file(weights, str(changed / "model.safetensors"), metadata={"format": "pt"})
    emitting = load(changed)
    ref = emitting.reference
    reference = type(ref)(ref.path, ref.model_class, (lang,))
    step = ForcedPrefix(TorchStep(emitting.model), [[lang]])
    greedy = greedy_search(step, src, MAX_NEW)
    beam = [list(h[0].tokens) for h in beam_search(step, src, 4, MAX_NEW)]
    assert sum(1 in ids[1:-1] for ids in greedy) >= 3  # <s> mid-output, then more tokens
    assert reference.generate(sources, 1, MAX_NEW) == greedy
    assert reference.generate(sources, 4, MAX_NEW) == beam


def test_a_default_target_language_for_the_server_and_the_bundle(
    nllb_dir: Path, bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`serve --target-lang` (Generator.load's target_lang) and `export --target-lang` (the
    bundle's default_target) give what a request naming that language gets, through the API,
    the CLI and the server (step batching); a request's own target_lang still wins."""
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    from serve_client import generate, running

    from edgeseq.runtime.serve.app import create_app

    opts = GenerationOptions(max_new_tokens=MAX_NEW)
    default = Generator.load(bundle)
    named = [r.text for r in default.generate(TEXTS, replace(opts, target_lang="deu_Latn"))]
    french = [r.text for r in default.generate(TEXTS, opts)]
    assert named != french  # the default (fra_Latn) and deu_Latn differ on the copy model
    gen = Generator.load(bundle, target_lang="deu_Latn")
    assert [r.text for r in gen.generate(TEXTS, opts)] == named
    assert [r.text for r in gen.generate(TEXTS, replace(opts, target_lang=TARGET))] == french
    with running(create_app(gen)) as port:  # the bundle has steps: greedy is step-batched
        for options, want in (({}, named), ({"target_lang": TARGET}, french)):
            status, body = generate(port, TEXTS, {"max_new_tokens": MAX_NEW, **options})
            assert status == 200 and [r["output"] for r in body["results"]] == want, body
    out = tmp_path / "deu"
    args = ["export", str(nllb_dir), "--out", str(out), "--target-lang", "deu_Latn"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["languages"]["default_target"] == "deu_Latn"
    assert json.loads((out / "manifest.json").read_text())["parity"]["source"]["passed"]
    args = ["generate", str(out), *TEXTS, "--max-new-tokens", str(MAX_NEW)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0 and result.stdout.splitlines() == named, result.output
    result = CliRunner().invoke(cli, ["verify", str(out), "--checkpoint", str(nllb_dir)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", ["export", "serve"])
def test_a_default_target_language_is_refused_with_one_line(
    command: str, nllb_dir: Path, bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An unknown code (with the model's list), and any code for a model without a language
    list (the built-in g2p-en), refused before anything is written or served."""
    codes = "deu_Latn, eng_Latn, fra_Latn, zho_Hans"
    if command == "export":
        _export_fails(nllb_dir, tmp_path / "a", codes, capsys, "--target-lang", "klingon")
        g2p = Path(__file__).resolve().parents[1] / "models" / "g2p-en"
        more = ("--target-lang", "fra_Latn")
        _export_fails(g2p, tmp_path / "b", "no language list", capsys, *more)
        return
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    code, err = run_main(["serve", str(bundle), "--target-lang", "klingon"], capsys)
    assert code == 1
    assert err == f"error: target language 'klingon' is not one of this model's: {codes}\n"
    code, err = run_main(["serve", "g2p-en", "--target-lang", "fra_Latn"], capsys)
    assert code == 1
    assert err == "error: this model has no language list: drop --target-lang (target_lang)\n"
