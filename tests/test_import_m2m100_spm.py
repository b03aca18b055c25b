"""M2M100Tokenizer's layout (vocab.json + sentencepiece.bpe.model, export/sources/m2m_100_spm.py):
the converted tokenizer's ids and decoding against M2M100Tokenizer, the export's parity with
the source model through the CLI, generation with `--target-lang fr`, and what is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the M2M-100 importer needs the hf extra")
pytest.importorskip("sentencepiece", reason="the test trains a SentencePiece model")

import torch
from click.testing import CliRunner
from hf_fixtures import synthetic_corpus
from m2m_fixtures import M2M100_MADEUP_WORDS, M2M100_TARGET, build_m2m_dir
from test_import_m2m100 import run_main
from transformers import M2M100ForConditionalGeneration, M2M100Tokenizer

from edgeseq.cli.main import cli
from edgeseq.export.heldout import HeldOut, with_languages
from edgeseq.export.parity import random_sources
from edgeseq.export.sources import SourceError
from edgeseq.export.sources.m2m_100 import load
from edgeseq.export.sources.m2m_100_tokenizer import CHECK_TEXTS
from edgeseq.runtime.metrics import score

WORDS = ["ton", "Ship", "the quick brown fox", "Straße naïve"]


@pytest.fixture(scope="module")
def m2m_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("m2m100") / "m2m100-tiny"
    return build_m2m_dir(path, layout="m2m100", copy_steps=200)


@pytest.fixture(scope="module")
def source(m2m_dir: Path) -> Any:
    return load(m2m_dir)


@pytest.fixture(scope="module")
def exported(m2m_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("m2m100") / "bundle"
    result = CliRunner().invoke(cli, ["export", str(m2m_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def swap(ids: list[int]) -> list[int]:
    """M2M-100 ids <-> edgeseq ids (`<s>` 0 and `<pad>` 1 trade places)."""
    return [{0: 1, 1: 0}.get(i, i) for i in ids]


def test_ids_and_decoding_equal_m2m100_tokenizers(m2m_dir: Path, source: Any) -> None:
    reference = M2M100Tokenizer.from_pretrained(m2m_dir, src_lang="en")
    tokenizer, codes = source.tokenizers.source, source.languages["codes"]
    assert source.languages["token_format"] == "__{}__"
    assert len(codes) == 100 and codes["fr"] == reference.get_lang_id("fr")
    assert all(codes[c] == reference.get_lang_id(c) for c in codes)
    hf = json.loads((m2m_dir / "config.json").read_text())
    assert tokenizer.vocab_size == hf["vocab_size"]
    assert f"{M2M100_MADEUP_WORDS} embedding rows without a token" in source.description
    lines = [
        *CHECK_TEXTS,
        *synthetic_corpus("source", 600, 11),
        *synthetic_corpus("target", 600, 12),
    ]
    lines += ["東京 and 東京x", "  \tspaces\n\nand  tabs  ", "ÅÉÎ ﬁ ①"]
    matched = decoded = 0
    for text in lines:
        want = swap(reference(text).input_ids)
        ids = tokenizer.encode(text)
        matched += want == [codes["en"], *ids, tokenizer.eos_id]
        if tokenizer.eos_id not in ids:  # edgeseq's decode stops at the first </s>
            want_text = reference.decode(reference(text).input_ids[1:], skip_special_tokens=True)
            decoded += tokenizer.decode([codes["fr"], *ids, tokenizer.eos_id]) == want_text
    assert (matched, decoded) == (len(lines), len(lines) - 1)
    assert len(lines) >= 1_000


def test_parity_levels_through_the_cli(exported: tuple[Path, str]) -> None:
    _, output = exported
    rows = [" ".join(out.split()) for out in output.splitlines()]  # columns vary in width
    for line in (
        "1 source: logits vs the source model, one call",
        "2 source: logits vs the source model, cached steps",
        "3 source: identical beam-1 ids (the source's own generate) 200/200 ok",
        "3 source: identical beam-4 ids (the source's own generate) 50/50 ok",
    ):
        assert any(row.startswith(line) and row.endswith(" ok") for row in rows), line
    config = json.loads((exported[0] / "config.json").read_text())
    languages = config["languages"]
    assert (languages["default_source"], languages["default_target"]) == ("en", M2M100_TARGET)
    assert languages["token_format"] == "__{}__" and languages["source_prefix"]


@pytest.mark.parametrize("language", [M2M100_TARGET, "de"])
def test_generate_with_a_target_language_prints_the_sources_output(
    m2m_dir: Path, exported: tuple[Path, str], language: str
) -> None:
    """`edgeseq generate --target-lang` prints what the source's generate + M2M100Tokenizer
    decode give for `[__en__] text </s>` with the language forced first (language tokens
    dropped: transformers 5's M2M100Tokenizer does not count them as special tokens)."""
    reference = M2M100Tokenizer.from_pretrained(m2m_dir, src_lang="en")
    model = M2M100ForConditionalGeneration.from_pretrained(m2m_dir).eval()
    batch = reference(WORDS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **batch, forced_bos_token_id=reference.get_lang_id(language), num_beams=1,
            max_new_tokens=20, do_sample=False,
        )  # fmt: skip
    languages = set(reference.lang_code_to_id.values())  # special tokens for edgeseq and fairseq
    rows = [[i for i in row if i not in languages] for row in out.tolist()]
    want = [reference.decode(row, skip_special_tokens=True) for row in rows]
    result = CliRunner().invoke(
        cli,
        ["generate", str(exported[0]), *WORDS, "--target-lang", language, "--max-new-tokens", "20"],
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == want
    assert len(set(want)) > 1  # the trained model's outputs depend on the input


def test_unknown_language_is_refused_with_the_list(
    exported: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(["generate", str(exported[0]), "ton", "--target-lang", "xx"], capsys)
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith("error: target language 'xx' is not one of this model's: af, am")
    assert lines[0].endswith("zh, zu")


def test_a_vocabulary_without_a_piece_and_unknown_code_lists_are_refused(
    m2m_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(m2m_dir, broken)
    vocab = json.loads((broken / "vocab.json").read_text(encoding="utf-8"))
    last = max(vocab, key=vocab.__getitem__)
    del vocab[last]
    (broken / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(SourceError, match="SentencePiece pieces are missing"):
        load(broken)
    (broken / "vocab.json").write_text((m2m_dir / "vocab.json").read_text(encoding="utf-8"))
    config = json.loads((broken / "tokenizer_config.json").read_text())
    (broken / "tokenizer_config.json").write_text(json.dumps(config | {"language_codes": "x"}))
    out = tmp_path / "out"
    code, err = run_main(["export", str(broken), "--out", str(out)], capsys)
    expected = (
        f"{broken}/tokenizer_config.json: language_codes 'x' is not one of m2m100, wmt21; "
        "set it to the list the checkpoint was trained with"
    )
    assert code == 1 and err == f"error: {expected}\n"
    assert not out.exists()


def test_data_gate_scores_what_generate_prints(m2m_dir: Path, source: Any, tmp_path: Path) -> None:
    """`--data` inputs get `__en__` and the forced `__fr__` as generate gives them: fp32's
    scores in the manifest are those of `edgeseq generate`'s outputs for the same inputs."""
    words = dict.fromkeys(line.split()[0] for line in synthetic_corpus("source", 200, seed=9))
    rows = [(w, w if i % 3 else "x") for i, w in enumerate(list(words)[:30])]
    data = tmp_path / "data.tsv"
    data.write_text("".join(f"{w}\t{ref}\n" for w, ref in rows), encoding="utf-8")
    out = tmp_path / "bundle"
    args = ["export", str(m2m_dir), "--out", str(out), "--data", str(data), "--variants", "int8"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    fp32 = manifest["variants"]["fp32"]
    (data.with_suffix("")).write_text("".join(f"{w}\n" for w, _ in rows), encoding="utf-8")
    printed = CliRunner().invoke(cli, ["generate", str(out), "--input", str(data.with_suffix(""))])
    assert printed.exit_code == 0, printed.output
    hyps = printed.output.splitlines()
    want = score(hyps, [[ref] for _, ref in rows], str.split)
    assert fp32["metric"] == "wer" and fp32["scores"]["count"] == len(rows)
    assert fp32["scores"]["wer"] == pytest.approx(want["wer"], abs=1e-6)
    assert fp32["scores"]["exact_match"] == pytest.approx(want["exact_match"], abs=1e-6)
    assert 0 < want["exact_match"] < 1  # the outputs are neither all right nor all wrong
    gate = manifest["variants"]["int8"]["gate"]
    assert gate["source"] == "data.tsv: 30 inputs"
    assert gate["fp32"] == pytest.approx(want["wer"], abs=1e-6)


def test_random_held_out_sources_carry_the_languages(source: Any) -> None:
    held = HeldOut(random_sources(source.model, 20), None, "random sources")
    laid_out = with_languages(held, source.languages, source.tokenizers, source.model)
    codes = source.languages["codes"]
    assert [ids[0] for ids in laid_out.sources] == [codes["en"]] * 20
    assert [ids[1:] for ids in laid_out.sources] == held.sources
    assert laid_out.target_prefix == (codes[M2M100_TARGET],)
    assert with_languages(held, None, source.tokenizers, source.model) is held
