"""ModelConfig: JSON round trip and errors that name every problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import ConfigError


def test_config_round_trips_through_json(tmp_path: Path) -> None:
    cfg = ModelConfig(
        src_vocab_size=31,
        tgt_vocab_size=73,
        d_model=64,
        n_heads=8,
        norm="pre",
        positional="learned",
        activation="gelu",
        tie_output=True,
    )
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    cfg.save(tmp_path / "config.json")
    text = (tmp_path / "config.json").read_text()
    assert text == json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"
    assert ModelConfig.load(tmp_path / "config.json") == cfg


def test_bad_config_names_every_problem() -> None:
    cfg = ModelConfig(
        src_vocab_size=10,
        tgt_vocab_size=10,
        d_model=30,
        n_heads=4,
        dropout=1.5,
        norm="middle",
        n_decoder_layers=0,
    )
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    message = str(info.value)
    for fragment in (
        "divisible by n_heads",
        "dropout must be in",
        "norm must be one of",
        "n_decoder_layers must be an integer >= 1",
    ):
        assert fragment in message


def test_special_ids_must_fit_and_differ() -> None:
    with pytest.raises(ConfigError, match=r"unk_id must be an id below.*must be distinct"):
        ModelConfig(src_vocab_size=3, tgt_vocab_size=10, unk_id=3, eos_id=2, bos_id=2).validate()


def test_unknown_and_missing_keys_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown model config keys: d_modle"):
        ModelConfig.from_dict({"src_vocab_size": 5, "tgt_vocab_size": 5, "d_modle": 8})
    with pytest.raises(ConfigError, match="lacks required keys: tgt_vocab_size"):
        ModelConfig.from_dict({"src_vocab_size": 5})
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json("{")
    with pytest.raises(ConfigError, match="does not exist"):
        ModelConfig.load(tmp_path / "missing.json")
