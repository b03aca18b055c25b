"""Tokenizer files other libraries read: special tokens registered in tokenizer.json, and a
tokenizer_config.json that transformers' PreTrainedTokenizerFast loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.tokenizer import (
    TOKENIZER_CONFIG_FILE,
    Tokenizer,
    TokenizerPair,
    tokenizer_config,
)

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "g2p-en"


def _pair() -> TokenizerPair:
    return TokenizerPair(
        Tokenizer.train_char(["hello", "world"]), Tokenizer.train_word(["HH EH1 L OW0"])
    )


def _specials(path: Path) -> dict[str, int]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {t["content"]: t["id"] for t in data["added_tokens"] if t["special"]}


def test_saved_tokenizers_register_their_special_tokens(tmp_path: Path) -> None:
    _pair().save(tmp_path, model_max_length=32)
    for name in ("tokenizer.json", "tokenizer.target.json"):
        assert _specials(tmp_path / name) == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    target = HFTokenizer.from_file(str(tmp_path / "tokenizer.target.json"))
    hh, eh = target.token_to_id("HH"), target.token_to_id("EH1")
    assert target.decode([1, hh, eh, 2], skip_special_tokens=True) == "HH EH1"
    assert target.decode([1, hh, 2], skip_special_tokens=False) == "<s> HH </s>"


def test_registering_special_tokens_keeps_ids_and_encodings(tmp_path: Path) -> None:
    plain = HFTokenizer.from_str(Tokenizer.train_char(["hello"]).to_str())
    data = json.loads(plain.to_str())
    data["added_tokens"] = []  # a tokenizer file written before special tokens were registered
    (tmp_path / "old.json").write_text(json.dumps(data), encoding="utf-8")
    tok = Tokenizer.load(tmp_path / "old.json")
    assert tok.hf.get_vocab(with_added_tokens=True) == plain.get_vocab(with_added_tokens=True)
    assert tok.encode("hello") == plain.encode("hello", add_special_tokens=False).ids
    assert tok.hf.decode([1, *tok.encode("he"), 2], skip_special_tokens=True) == "he"


def test_tokenizer_config_names_every_special_token(tmp_path: Path) -> None:
    _pair().save(tmp_path, model_max_length=32)
    config = json.loads((tmp_path / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
    assert config == tokenizer_config(32)
    assert [config[r] for r in ("pad_token", "bos_token", "eos_token", "unk_token")] == list(
        SPECIAL_TOKENS
    )
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["model_max_length"] == 32


def test_shipped_model_tokenizer_files_register_special_tokens() -> None:
    for name in ("tokenizer.json", "tokenizer.target.json"):
        assert _specials(SHIPPED / name) == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    config = json.loads((SHIPPED / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
    model = json.loads((SHIPPED / "config.json").read_text(encoding="utf-8"))
    assert config == tokenizer_config(model["max_len"])


def test_transformers_loads_the_tokenizer_with_its_special_tokens(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pair = _pair()
    pair.save(tmp_path, model_max_length=32)
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id, fast.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    ids = [1, *pair.source.encode("hello"), 2]
    assert fast.decode(ids, skip_special_tokens=True) == "hello"
    assert fast.model_max_length == 32
