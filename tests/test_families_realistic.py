"""Each Hugging Face family at a realistic shape (issue 45): d_model 512, 8 heads, 6 + 6
layers and an embedding of 32,768 rows (M2M-100 also with NLLB-200's 256,206), random
weights, exported by the default command `edgeseq export DIR --out BUNDLE`, whose three
parity levels against the source model (one call's logits, cached steps, the ids of the
source's own `generate` greedy and beam 4) pass.

Marker `families` (`make test-families`, 5-6 min per family on 2 idle cores, 30 min for
the 256,206-row M2M-100 on busy ones; not in `make test`). The checkpoints are the fixture
modules' builders at this shape; their tokenizers (trained here on the synthetic corpus)
have a few hundred pieces, and the embedding is padded with random rows up to VOCAB_ROWS,
rows every adapter maps and leaves without a token (as NLLB-200's and t5-small's files have
some). Each test prints the export's output (the parity report lines).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("sentencepiece", reason="the hf extra is not installed")

pytestmark = [pytest.mark.families, pytest.mark.slow]

D_MODEL, HEADS, LAYERS = 512, 8, 6
VOCAB_ROWS = 32768
NLLB_ROWS = 256206  # NLLB-200's vocabulary, the largest a family ships


def pad_vocabulary(path: Path, rows: int = VOCAB_ROWS, seed: int = 0) -> None:
    """Grow the checkpoint in `path` to `rows` vocabulary rows: every token table (rows,
    d_model) and `final_logits_bias` (1, rows) of model.safetensors gets random rows of a
    trained table's scale appended, and config.json's vocab_size says `rows`.

    The rows come from numpy's generator, not torch's: the fixtures draw their tables from
    torch's seeded stream at the same scale, and rows drawn from it again repeated those tables
    (at 256,206 rows, each of the first 507 rows twice: exactly tied logits, arbitrary beam
    choices). Every table is checked for repeated rows."""
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    old, width = config["vocab_size"], config["d_model"]
    state = load_file(str(path / "model.safetensors"))
    rng = np.random.default_rng(seed)
    probe = torch.from_numpy(rng.standard_normal(width))  # float64: one number per row
    for key, tensor in state.items():
        if tensor.ndim == 2 and tensor.shape == (old, width):
            extra = rng.standard_normal((rows - old, width), dtype=np.float32) * width**-0.5
            table = torch.cat([tensor, torch.from_numpy(extra).to(tensor.dtype)]).contiguous()
            assert len(torch.unique(table.double() @ probe)) == rows, f"{key}: repeated rows"
            state[key] = table
        elif key.endswith("final_logits_bias"):
            extra = rng.standard_normal((1, rows - old), dtype=np.float32) * 0.5
            state[key] = torch.cat([tensor, torch.from_numpy(extra).to(tensor.dtype)], dim=1)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config["vocab_size"] = rows
    (path / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def m2m_100(path: Path) -> Path:
    from m2m_fixtures import build_m2m_dir

    return build_m2m_dir(path, d_model=D_MODEL, layers=LAYERS, heads=HEADS)


def mbart_50(path: Path) -> Path:
    from mbart_fixtures import build_mbart50_dir

    return build_mbart50_dir(path, d_model=D_MODEL, layers=LAYERS, heads=HEADS)


def bart(path: Path) -> Path:
    from mbart_fixtures import build_bart_dir

    built = build_bart_dir(path, d_model=D_MODEL, layers=LAYERS, heads=HEADS)
    reinit_projections(built, std=0.02)
    return built


def reinit_projections(path: Path, std: float, seed: int = 0) -> None:
    """Draw every attention and feed-forward matrix of the checkpoint in `path` anew from
    N(0, std^2). build_bart_dir's init_std 0.2 lets the tiny model learn to copy; at d_model
    512 it gives attention logits of a few hundred (a saturated softmax), and the exported
    encoder's output then differed from PyTorch's by 1.6e-3 (over the 1e-4 fp32 tolerance;
    greedy and beam ids all equal). BART's own init_std is 0.02."""
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    for key, tensor in state.items():
        if key.endswith(("proj.weight", "fc1.weight", "fc2.weight")):
            state[key] = (torch.randn(tensor.shape, generator=generator) * std).to(tensor.dtype)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def t5_v1_1(path: Path) -> Path:
    from t5_fixtures import build_t5_dir

    return build_t5_dir(path, version="1.1", d_model=D_MODEL, layers=LAYERS, heads=HEADS)


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "m2m_100": m2m_100,
    "m2m_100-nllb-vocabulary": m2m_100,
    "mbart-50": mbart_50,
    "bart": bart,
    "t5-v1.1": t5_v1_1,
}
ROWS = {"m2m_100-nllb-vocabulary": NLLB_ROWS}  # the others: VOCAB_ROWS


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_realistic_shape_passes_the_three_parity_levels(family: str, tmp_path: Path) -> None:
    source = BUILDERS[family](tmp_path / family)
    pad_vocabulary(source, ROWS.get(family, VOCAB_ROWS))
    edgeseq = Path(sys.executable).with_name("edgeseq")
    bundle = tmp_path / "bundle"
    run = subprocess.run(
        [str(edgeseq), "export", str(source), "--out", str(bundle)],
        capture_output=True, text=True, timeout=3600,  # ~5 min idle; far more on a busy machine
    )  # fmt: skip
    print(f"== {family}\n{run.stdout}{run.stderr}")
    assert run.returncode == 0, run.stdout + run.stderr
    parity = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))["parity"]
    group = parity["source"]
    assert parity["passed"] and group["passed"], group
    assert group["level1"]["passed"] and group["level2"]["passed"] and group["level3"]["passed"]
    for search in ("greedy", "beam"):
        level3 = group["level3"][search]
        assert level3["identical"] == level3["inputs"] > 0, (search, level3)
    model = json.loads((bundle / "config.json").read_text(encoding="utf-8"))["model"]
    assert (model["d_model"], model["n_heads"]) == (D_MODEL, HEADS)
    assert model["n_encoder_layers"] == model["n_decoder_layers"] == LAYERS
    assert model["tgt_vocab_size"] >= 32000
