"""`edgeseq grow --d-ff`: a wider copy of a trained checkpoint that computes the same function."""

from __future__ import annotations

from pathlib import Path

import torch
from click.testing import CliRunner

from edgeseq.build_model.checkpoint import load_checkpoint, save_checkpoint
from edgeseq.runtime.cli import cli
from edgeseq.runtime.errors import ConfigError

TASK = {"name": "reverse", "options": {}}


def _checkpoint(runtime_model, path: Path) -> Path:
    return save_checkpoint(path, runtime_model.model, runtime_model.tokenizers, TASK, {"step": 9})


def test_wider_ffn_computes_the_same_logits_and_has_room_to_learn(
    runtime_model, tmp_path: Path
) -> None:
    source = _checkpoint(runtime_model, tmp_path / "ckpt")
    old_cfg = runtime_model.model.cfg
    out = tmp_path / "wide"
    d_ff = old_cfg.d_ff * 2
    result = CliRunner().invoke(cli, ["grow", str(source), "--out", str(out), "--d-ff", str(d_ff)])
    assert result.exit_code == 0, result.output
    assert f"d_ff {old_cfg.d_ff} -> {d_ff}" in result.output
    wide, _, meta = load_checkpoint(out)
    assert wide.cfg.d_ff == d_ff and meta.train_state["grown_d_ff"] == [old_cfg.d_ff, d_ff]
    assert wide.cfg.n_decoder_layers == old_cfg.n_decoder_layers  # depth unchanged
    old, new = runtime_model.model.state_dict(), wide.state_dict()
    for name in ("encoder_layers.0.ffn", "decoder_layers.1.ffn"):
        w_1, b_1, w_2 = (new[f"{name}.{p}"] for p in ("w_1.weight", "w_1.bias", "w_2.weight"))
        assert w_1.shape == (d_ff, old_cfg.d_model) and w_2.shape == (old_cfg.d_model, d_ff)
        torch.testing.assert_close(w_1[: old_cfg.d_ff], old[f"{name}.w_1.weight"])
        assert w_1[old_cfg.d_ff :].abs().min() > 0  # new hidden units are live ...
        assert not b_1[old_cfg.d_ff :].any() and not w_2[:, old_cfg.d_ff :].any()  # ... unread
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 5, 2, 0, 0]])
    tgt = torch.tensor([[1, 8, 7, 6], [1, 5, 9, 2]])
    with torch.no_grad():
        want = runtime_model.model.eval()(src, tgt)
        got = wide.eval()(src, tgt)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_grow_refuses_to_narrow_or_to_do_nothing(runtime_model, tmp_path: Path) -> None:
    source = _checkpoint(runtime_model, tmp_path / "ckpt")
    narrow = CliRunner().invoke(
        cli, ["grow", str(source), "--out", str(tmp_path / "a"), "--d-ff", "8"]
    )
    assert narrow.exit_code != 0 and isinstance(narrow.exception, ConfigError)
    assert "cannot narrow the FFN" in str(narrow.exception)
    same = CliRunner().invoke(cli, ["grow", str(source), "--out", str(tmp_path / "b")])
    assert same.exit_code != 0 and "nothing to grow" in str(same.exception)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
