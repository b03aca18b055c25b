"""`edgeseq grow`: a deeper checkpoint whose new layers copy trained ones, and with `--d-ff` a
wider one that computes the same function."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from edgeseq.build_model.checkpoint import load_checkpoint, save_checkpoint, stacked_layer_map
from edgeseq.build_model.train import train
from edgeseq.cli.main import cli
from edgeseq.runtime.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
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


def test_stacked_layer_map() -> None:
    assert stacked_layer_map(3, 6) == [0, 0, 1, 1, 2, 2]
    assert stacked_layer_map(3, 4) == [0, 0, 1, 2]
    assert stacked_layer_map(2, 2) == [0, 1]
    with pytest.raises(ConfigError, match="cannot drop layers"):
        stacked_layer_map(3, 2)


def test_grow_copies_trained_layers_and_trains_on(
    trained_run, small_recipe_factory, tmp_path: Path
) -> None:
    """`edgeseq grow` writes a deeper checkpoint whose layers are copies of the trained ones;
    `train --init-from` with a recipe of the new depth continues from it."""
    run, _ = trained_run
    source, _, _ = load_checkpoint(run / "last")
    n_enc, n_dec = source.cfg.n_encoder_layers, source.cfg.n_decoder_layers
    out = tmp_path / "grown"
    args = ["grow", str(run / "last"), "--out", str(out)]
    args += ["--encoder-layers", str(n_enc + 1), "--decoder-layers", str(2 * n_dec)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "parameters" in result.output and "d_ff" not in result.output  # depth only
    grown, _, meta = load_checkpoint(out)
    assert (grown.cfg.n_encoder_layers, grown.cfg.n_decoder_layers) == (n_enc + 1, 2 * n_dec)
    layers = meta.train_state["grown_layers"]
    assert layers["encoder"] == stacked_layer_map(n_enc, n_enc + 1)
    assert layers["decoder"] == stacked_layer_map(n_dec, 2 * n_dec)
    old, new = source.state_dict(), grown.state_dict()
    for name, value in new.items():
        for prefix, mapping in (
            ("encoder_layers.", layers["encoder"]),
            ("decoder_layers.", layers["decoder"]),
        ):
            if name.startswith(prefix):
                index, rest = name[len(prefix) :].split(".", 1)
                name = f"{prefix}{mapping[int(index)]}.{rest}"
        torch.testing.assert_close(value, old[name], rtol=0, atol=0)
    recipe = small_recipe_factory(epochs=1, n_encoder_layers=n_enc + 1, n_decoder_layers=2 * n_dec)
    train(None, recipe, tmp_path / "deeper", init_from=out, progress=False)
    continued, _, _ = load_checkpoint(tmp_path / "deeper" / "last")
    assert continued.cfg.n_decoder_layers == 2 * n_dec
    shrink_args = ["grow", str(out), "--out", str(tmp_path / "x")]
    shrink_args += ["--encoder-layers", "1", "--decoder-layers", "1"]
    shrink = CliRunner().invoke(cli, shrink_args)
    assert shrink.exit_code != 0 and "cannot drop layers" in str(shrink.exception)
    onto_run = CliRunner().invoke(cli, [*args[:2], "--out", str(run), *args[4:]])
    assert onto_run.exit_code != 0 and "choose a new directory" in str(onto_run.exception)
    assert (run / "last" / "model.safetensors").is_file()
