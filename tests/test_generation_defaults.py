"""A source's generation settings as a bundle's defaults (export/sources/generation_config.py,
runtime/options.py, runtime/rules.py): a MarianMT checkpoint whose generation_config sets
beams, a length penalty, a max length, bad words, no-repeat n-grams and a forced `</s>` gives
with `edgeseq generate` and no flags the ids transformers' `generate()` gives with no
arguments; an explicit option wins; what edgeseq does not implement is named at export."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("sentencepiece", reason="the hf extra is not installed")

from hf_fixtures import build_marian_dir

from edgeseq.cli.main import cli
from edgeseq.export.sources.generation_config import read_generation
from edgeseq.runtime import GenerationOptions, Generator
from edgeseq.runtime.rules import Constrained

TEXTS = ["the house", "ber ton ship", "kalo mi", "quest chou lyness", "an"]
TEXTS += ["mi mi mi ka lo ber", "Straße naïve"]
# Marian ids of two pieces the bad words ban (looked up in vocab.json by the fixture)
BANNED_PIECES = ("▁the", "ing")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy-trained tiny MarianMT with a rich generation_config."""
    root = tmp_path_factory.mktemp("gendef")
    path = build_marian_dir(root / "opus-mt-gen", copy_steps=150)
    vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    config = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
    pad = config["pad_token_id"]
    config |= {"num_beams": 3, "length_penalty": 0.7, "max_length": 7}
    config |= {"no_repeat_ngram_size": 2, "forced_eos_token_id": 0}
    config["bad_words_ids"] = [[pad], [vocab[BANNED_PIECES[0]]], [vocab["▁"], vocab["ing"]]]
    (path / "generation_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The checkpoint exported by the CLI (fp32, parity on): {"bundle", "output"}."""
    bundle = tmp_path_factory.mktemp("gendef-bundle") / "bundle"
    args = ["export", str(checkpoint), "--out", str(bundle), "--inputs", "16"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return {"bundle": bundle, "output": result.output}


def transformers_ids(checkpoint: Path, generator: Generator, **kwargs: Any) -> list[list[int]]:
    """MarianMTModel.generate(**kwargs) per text, in edgeseq ids without start and `</s>`."""
    from transformers import MarianMTModel

    from edgeseq.export.sources.marian_tokenizer import to_edgeseq_ids, to_marian_ids

    model = MarianMTModel.from_pretrained(checkpoint).eval()
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    out = []
    for text in TEXTS:
        ids = to_marian_ids(list(generator.encode(text).ids), pad)
        row = model.generate(input_ids=_tensor([ids]), **kwargs)[0].tolist()
        kept = [i for i in row[1:] if i not in (pad, eos)]
        out.append([int(i) for i in to_edgeseq_ids(kept, pad)])
    return out


def _tensor(rows: list) -> Any:
    import torch

    return torch.tensor(np.asarray(rows), dtype=torch.int64)


def cli_ids(bundle: Path, *flags: str) -> list[list[int]]:
    """`edgeseq generate BUNDLE TEXTS --json FLAGS`: the ids per text."""
    result = CliRunner().invoke(cli, ["generate", str(bundle), *TEXTS, "--json", *flags])
    assert result.exit_code == 0, result.output
    return [json.loads(line)["ids"] for line in result.stdout.splitlines()]


def test_the_bundle_records_the_settings_edgeseq_implements(exported: dict[str, Any]) -> None:
    config = json.loads((exported["bundle"] / "config.json").read_text(encoding="utf-8"))
    generation = config["generation"]
    assert generation["beam_size"] == 3 and generation["length_penalty"] == 0.7
    assert generation["max_new_tokens"] == 6 and generation["forced_eos"] is True
    assert generation["no_repeat_ngram_size"] == 2 and generation["early_stopping"] is False
    assert len(generation["bad_words_ids"]) == 2  # <pad>: the graph never outputs it
    assert "generation defaults:" in exported["output"]
    manifest = json.loads((exported["bundle"] / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["parity"]["source"]["passed"]  # level 3 under today's explicit settings


def test_generate_without_flags_gives_transformers_generate_without_arguments(
    checkpoint: Path, exported: dict[str, Any]
) -> None:
    generator = Generator.load(exported["bundle"], providers="cpu")
    want = transformers_ids(checkpoint, generator)
    assert any(len(ids) == 5 for ids in want)  # some outputs end at the cap (forced </s>)
    assert cli_ids(exported["bundle"]) == want
    assert [list(r.token_ids) for r in generator.generate(TEXTS)] == want


def test_an_explicit_option_wins(checkpoint: Path, exported: dict[str, Any]) -> None:
    generator = Generator.load(exported["bundle"], providers="cpu")
    greedy = transformers_ids(checkpoint, generator, num_beams=1, no_repeat_ngram_size=0)
    flags = ("--beam", "1", "--no-repeat-ngram-size", "0")
    assert cli_ids(exported["bundle"], *flags) == greedy
    options = GenerationOptions(beam_size=1, no_repeat_ngram_size=0)
    assert [list(r.token_ids) for r in generator.generate(TEXTS, options)] == greedy
    longer = transformers_ids(checkpoint, generator, max_new_tokens=20, forced_eos_token_id=None)
    assert longer != transformers_ids(checkpoint, generator)  # the model's cap changed outputs
    flags = ("--max-new-tokens", "20", "--no-forced-eos")
    assert cli_ids(exported["bundle"], *flags) == longer


def test_rules_hold_in_every_output(exported: dict[str, Any]) -> None:
    generator = Generator.load(exported["bundle"], providers="cpu")
    options = generator.resolve(GenerationOptions(max_new_tokens=30, forced_eos=False))
    for result in generator.generate(TEXTS, options):
        ids = [generator.config.bos_id, *result.token_ids]
        pairs = list(itertools.pairwise(ids))
        assert len(pairs) == len(set(pairs))  # no 2-gram twice
        banned = {w[0] for w in options.bad_words_ids if len(w) == 1}
        assert not banned & set(result.token_ids)


def test_unimplemented_settings_are_named_at_export(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    path.mkdir()
    config = {"num_beams": 2, "repetition_penalty": 1.3, "do_sample": True, "top_k": 50}
    config |= {"forced_eos_token_id": 7, "eos_token_id": 0, "transformers_version": "5"}
    (path / "generation_config.json").write_text(json.dumps(config), encoding="utf-8")
    record = read_generation(path, lambda i: i + 2, eos_id=0)
    assert record.settings == {"beam_size": 2, "early_stopping": False}
    named = " ".join(record.ignored)
    for key in ("repetition_penalty", "do_sample", "forced_eos_token_id"):
        assert key in named
    assert "top_k" not in named  # transformers' default: no effect
    assert len(record.ignored) == 3


def test_config_json_settings_when_there_is_no_generation_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "marian", "d_model": 8, "max_length": 40, "min_length": 3}),
        encoding="utf-8",
    )
    record = read_generation(tmp_path, lambda i: i, eos_id=0)
    assert record.settings == {"max_new_tokens": 39, "min_new_tokens": 2}
    assert record.ignored == ()
    assert read_generation(tmp_path / "nothing", lambda i: i, eos_id=0).settings == {}


def test_rules_ban_what_transformers_processors_ban() -> None:
    import torch
    from transformers.generation import logits_process as lp

    rng = np.random.default_rng(0)
    history = rng.integers(0, 5, (8, 7))  # (B, T) tokens so far, the start token first
    model = SimpleNamespace(max_len=32, vocab_size=6, bos_id=1, eos_id=2, pad_id=0)
    words = ((3,), (4, 0), (1, 2, 4))
    cases = [({"no_repeat_ngram_size": n}, lp.NoRepeatNGramLogitsProcessor(n)) for n in (1, 2, 3)]
    cases.append(({"bad_words_ids": words}, lp.NoBadWordsLogitsProcessor([list(w) for w in words])))
    cases.append(({"min_new_tokens": 7}, lp.MinNewTokensLengthLogitsProcessor(1, 7, 2)))
    cases.append(({"forced_eos": True}, lp.ForcedEOSTokenLogitsProcessor(8, 2)))
    for settings, processor in cases:
        rule = Constrained(model, GenerationOptions(**settings), budget=history.shape[1])
        ours = rule.apply(np.zeros((8, 6)), history)
        theirs = processor(torch.as_tensor(history), torch.zeros((8, 6))).numpy()
        assert (np.isinf(ours) == np.isinf(theirs)).all(), settings
        assert np.isinf(ours).any(), settings  # the case bans something


def test_a_bad_generation_object_is_refused() -> None:
    from edgeseq.runtime.bundle import read_generation as read_recorded
    from edgeseq.runtime.errors import BundleError

    where = Path("bundle/config.json")
    assert read_recorded(None, where) is None
    assert read_recorded({"bad_words_ids": [[5]]}, where) == {"bad_words_ids": ((5,),)}
    with pytest.raises(BundleError, match="unknown settings"):
        read_recorded({"num_beams": 4}, where)
    with pytest.raises(BundleError, match="beam_size must be a positive integer"):
        read_recorded({"beam_size": 0}, where)
