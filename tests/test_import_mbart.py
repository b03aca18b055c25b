"""Importing Hugging Face BART and mBART-50 checkpoints (export/sources/mbart.py): the weight
map, logits, cached steps and the source's own greedy and beam-4 generate, the tokenizers'
ids, the bundles through the CLI and the API (mBART-50 with --target-lang), and what the
adapter refuses (one `error:` line, exit 1, nothing at --out)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the BART importer needs the hf extra")
pytest.importorskip("sentencepiece", reason="the test trains a SentencePiece model")

from click.testing import CliRunner
from hf_fixtures import synthetic_corpus
from mbart_fixtures import SOURCE, TARGET, build_bart_dir, build_mbart50_dir
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from edgeseq.build_model.torch_step import TorchStep
from edgeseq.cli.main import cli, main
from edgeseq.export.sources import SourceError, detect_adapter
from edgeseq.export.sources.mbart import load
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.prefix import ForcedPrefix
from edgeseq.runtime.search import GenerationOptions, beam_search, greedy_search

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MAX_NEW = 20
TEXTS = ["Straße naïve façade", "the quick brown fox", "λόγος", "Hello world, 42!", "ton"]
FAMILIES = ("bart", "mbart")
SWAP = {0: 1, 1: 0}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mbart")
    return {
        "bart": build_bart_dir(root / "bart-tiny", copy_steps=200),
        "mbart": build_mbart50_dir(root / "mbart50-tiny", copy_steps=200),
    }


@pytest.fixture(scope="module")
def sources(dirs: dict[str, Path]) -> dict[str, Any]:
    return {family: load(path) for family, path in dirs.items()}


@pytest.fixture(scope="module")
def bundles(dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each checkpoint exported by the CLI, parity level 3 on 20 corpus words (--data)."""
    out, root = {}, tmp_path_factory.mktemp("mbart-bundles")
    data = root / "held-out.txt"
    words = dict.fromkeys(line.split()[0] for line in synthetic_corpus("source", 60, seed=11))
    data.write_text("\n".join(list(words)[:20]) + "\n", encoding="utf-8")
    for family, path in dirs.items():
        out[family] = root / f"{family}-bundle"
        args = ["export", str(path), "--out", str(out[family]), "--data", str(data)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
    return out


def prefix(source: Any) -> list[int]:
    """What goes before a source's tokens: `<s>` (BART) or the source language (mBART-50)."""
    if source.languages is None:
        return [source.tokenizers.source.bos_id]
    return [source.languages["codes"][SOURCE]]


def inputs(source: Any) -> list[list[int]]:
    """24 corpus words and TEXTS as the source model reads them, edgeseq ids."""
    words = dict.fromkeys(line.split()[0] for line in synthetic_corpus("source", 60, seed=7))
    tok = source.tokenizers.source
    return [[*prefix(source), *tok.encode(t), 2] for t in [*list(words)[:24], *TEXTS]]


@pytest.mark.parametrize("family", FAMILIES)
def test_config_and_weight_map(dirs: dict[str, Path], sources: dict[str, Any], family: str) -> None:
    path, source = dirs[family], sources[family]
    assert detect_adapter(path) == "mbart" and source.adapter == "mbart"
    cfg, model = source.model.cfg, source.model
    hf = json.loads((path / "config.json").read_text())
    mbart = family == "mbart"
    assert (cfg.norm, cfg.has_final_norm, cfg.embedding_norm, cfg.source_bos) == (
        ("pre", True, True, False) if mbart else ("post", False, True, True)
    )
    assert (cfg.positional, cfg.scale_embedding, cfg.has_output_bias) == ("learned", mbart, True)
    assert cfg.tie_output  # the output projection is the target embedding, plus the bias
    assert (cfg.src_vocab_size, cfg.max_len) == (hf["vocab_size"], hf["max_position_embeddings"])
    state = load_file(str(path / "model.safetensors"))
    shared = state["model.shared.weight"]
    assert torch.equal(model.src_embed.weight[1], shared[0])  # <pad> and <s> swapped
    assert torch.equal(model.tgt_embed.weight[1], shared[0])  # <s> keeps its row, and
    assert cfg.start_id == cfg.eos_id == 2  # decoding starts from </s>, as the source's
    assert torch.equal(model.output.weight[1], shared[0])
    assert torch.equal(model.output.bias[4:], state["final_logits_bias"][0, 4:])
    for ours, side in ((model.src_pos, "encoder"), (model.tgt_pos, "decoder")):
        assert torch.equal(ours.table, state[f"model.{side}.embed_positions.weight"][2:])
    assert not torch.equal(model.src_pos.table, model.tgt_pos.table)  # one table per stack
    norm = state["model.decoder.layernorm_embedding.weight"]
    assert torch.equal(model.tgt_embed_norm.weight, norm)
    assert "ids equal to transformers' on 7/7" in source.description
    assert (source.languages is None) == (family == "bart")
    if mbart:
        assert len(source.languages["codes"]) == 52 and "<s>" not in source.languages["codes"]
        assert (source.languages["default_source"], source.languages["default_target"]) == (
            SOURCE, TARGET,
        )  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_cached_steps_equal_the_source(sources: dict[str, Any], family: str) -> None:
    """Levels 1 and 2 against BartForConditionalGeneration / MBartForConditionalGeneration."""
    source, rng = sources[family], np.random.default_rng(0)
    src = right_pad(inputs(source)[:8], 0)
    tgt = right_pad([[2, *rng.integers(4, 300, n).tolist()] for n in (5, 1, 8, 3) * 2], 0)
    want = source.reference.logits(src, tgt).numpy()
    model, step, steps = source.model, TorchStep(source.model), []
    with torch.no_grad():
        full = model(torch.as_tensor(src), torch.as_tensor(tgt)).numpy()
        state = step.start(src)
        for t in range(tgt.shape[1]):
            logits, state = step.step(state, tgt[:, t : t + 1])
            steps.append(logits[:, 0])
    real = tgt != 0
    assert np.abs(full[real] - want[real]).max() < 1e-4
    assert np.abs(np.stack(steps, axis=1)[real] - want[real]).max() < 1e-4


@pytest.mark.parametrize(
    ("family", "language"), [("bart", None), ("mbart", TARGET), ("mbart", "de_DE")]
)
def test_greedy_and_beam_equal_the_sources_generate(
    sources: dict[str, Any], family: str, language: str | None
) -> None:
    """Level 3: the source's generate (mBART-50: forced_bos_token_id) vs edgeseq's search
    (forcing the same language token), greedy and beam 4."""
    source, src_ids = sources[family], inputs(sources[family])
    forced = (source.languages["codes"][language],) if language else ()
    ref = source.reference
    reference = type(ref)(ref.path, ref.model_class, forced)
    step = (
        ForcedPrefix(TorchStep(source.model), [list(forced)]) if forced else TorchStep(source.model)
    )
    src = right_pad(src_ids, 0)
    greedy = greedy_search(step, src, MAX_NEW)
    beam = [list(h[0].tokens) for h in beam_search(step, src, 4, MAX_NEW)]
    assert reference.generate(src_ids, 1, MAX_NEW) == greedy
    assert reference.generate(src_ids, 4, MAX_NEW) == beam
    if language != "de_DE":  # the trained direction: varied lengths, greedy != beam
        assert len({len(ids) for ids in greedy + beam}) > 3 and greedy != beam


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_gives_the_sources_ids(
    dirs: dict[str, Path], sources: dict[str, Any], family: str
) -> None:
    source = sources[family]
    hf = AutoTokenizer.from_pretrained(
        dirs[family], **({"src_lang": SOURCE} if family == "mbart" else {})
    )
    ours = source.tokenizers.source
    lines = synthetic_corpus("target", 1000, seed=3) + TEXTS + ["  «Ünïcödé» 3,14 € — ¿qué? ½"]
    matched = sum(
        [SWAP.get(i, i) for i in hf(text).input_ids] == [*prefix(source), *ours.encode(text), 2]
        for text in lines
    )
    assert matched == len(lines)
    ids = hf(lines[:50] + TEXTS).input_ids
    assert [ours.decode([SWAP.get(i, i) for i in row]) for row in ids] == hf.batch_decode(
        ids, skip_special_tokens=True
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_bundle_generates_the_sources_text(
    bundles: dict[str, Path], dirs: dict[str, Path], family: str
) -> None:
    """The exported bundle's parity group passed, and the CLI and the API give the text of
    transformers' tokenizer + generate + batch_decode (mBART-50: per target language)."""
    bundle, path = bundles[family], dirs[family]
    manifest = json.loads((bundle / "manifest.json").read_text())
    group = manifest["parity"]["source"]
    assert group["passed"] and group["level3"]["beam"]["identical"] == 20
    model_cfg = json.loads((bundle / "config.json").read_text())["model"]
    assert model_cfg["embedding_norm"] is True
    assert model_cfg.get("source_bos", False) == (family == "bart")
    gen = Generator.load(bundle)
    hf = AutoTokenizer.from_pretrained(path, **({"src_lang": SOURCE} if family == "mbart" else {}))
    model = AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    batch = hf(TEXTS, return_tensors="pt", padding=True)
    for language in (TARGET, "de_DE") if family == "mbart" else (None,):
        forced = {"forced_bos_token_id": hf.convert_tokens_to_ids(language)} if language else {}
        out = model.generate(**batch, max_new_tokens=MAX_NEW, num_beams=1, **forced)
        want = hf.batch_decode(out, skip_special_tokens=True)
        opts = GenerationOptions(max_new_tokens=MAX_NEW, target_lang=language)
        assert [r.text for r in gen.generate(TEXTS, opts)] == want
        args = ["generate", str(bundle), *TEXTS, "--max-new-tokens", str(MAX_NEW)]
        args += ["--target-lang", language] if language else []
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0 and result.stdout.splitlines() == want, result.output
    assert gen.encode("ton").ids[0] == (
        1 if family == "bart" else gen.bundle.languages.codes[SOURCE]
    )


def run_main(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """`edgeseq ARGV` as the console runs it: (exit code, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code), capsys.readouterr().err


@pytest.mark.parametrize("family", FAMILIES)
def test_unknown_language_is_one_error_line(
    bundles: dict[str, Path], family: str, capsys: pytest.CaptureFixture
) -> None:
    code, err = run_main(["generate", str(bundles[family]), "a", "--target-lang", "xx_XX"], capsys)
    want = (
        "no language list: drop --target-lang"
        if family == "bart"
        else "target language 'xx_XX' is not one of this model's: af_ZA, ar_AR"
    )
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1 and want in err, err


def _changed(path: Path, tmp_path: Path, config: dict[str, Any], file: str = "config.json") -> Path:
    changed = tmp_path / "changed"
    shutil.copytree(path, changed)
    data = json.loads((changed / file).read_text())
    (changed / file).write_text(json.dumps(data | config))
    return changed


@pytest.mark.parametrize(
    ("family", "file", "changes", "match"),
    [
        ("bart", "config.json", {"model_type": "t5"}, "model_type is 't5'; the mbart adapter"),
        ("bart", "config.json", {"activation_function": "tanh"}, "'tanh' is not mapped"),
        ("bart", "config.json", {"forced_bos_token_id": 0}, "forced_bos_token_id is 0"),
        ("bart", "generation_config.json", {"forced_bos_token_id": 0}, "forced_bos_token_id"),
        ("mbart", "config.json", {"decoder_ffn_dim": 48}, "encoder_ffn_dim != decoder_ffn_dim"),
        ("mbart", "tokenizer_config.json", {"tokenizer_class": "MBartTokenizer"}, "mBART-cc25"),
        ("mbart", "config.json", {"vocab_size": 300}, "the tokenizer has 454 ids but the model's"),
        ("bart", "config.json", {"max_position_embeddings": 100}, "max_position_embeddings 100"),
    ],
)
def test_refuses_what_does_not_map(
    dirs: dict[str, Path],
    tmp_path: Path,
    family: str,
    file: str,
    changes: dict[str, Any],
    match: str,
    capsys: pytest.CaptureFixture,
) -> None:
    path, out = _changed(dirs[family], tmp_path, changes, file), tmp_path / "out"
    with pytest.raises(SourceError, match=match.replace("(", r"\(")):
        load(path)
    code, err = run_main(["export", str(path), "--out", str(out), "--source", "mbart"], capsys)
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert match in lines[0] and not out.exists()
