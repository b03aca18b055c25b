"""The embedded default, `models/g2p-en`: inside its size budget, loadable, of the shape that
the last of its stage recipes (`models/g2p-en/recipes/`) builds, with every stage recipe named
in its model card, and with its parameter count stated there."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeseq.build_model.checkpoint import load_checkpoint
from edgeseq.build_model.train import Recipe

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODELS = Path(__file__).parents[1] / "models"
BUDGET_BYTES = 40 * 1000 * 1000  # everything under models/ (issue 5)


def test_models_directory_is_under_its_40_mb_budget() -> None:
    total = sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file())
    assert 0 < total < BUDGET_BYTES, f"models/ holds {total / 1e6:.1f} MB"


def test_shipped_checkpoint_loads_with_its_card_and_a_matching_recipe() -> None:
    model, _, meta = load_checkpoint(MODELS / "g2p-en")
    assert meta.task["name"] == "g2p"
    stages = sorted((MODELS / "g2p-en" / "recipes").glob("*.json"))
    assert len(stages) > 1, "models/g2p-en/recipes/ should hold one recipe per training stage"
    last = Recipe.load(stages[-1])
    mismatched = {k: v for k, v in last.model.items() if getattr(model.cfg, k) != v}
    assert not mismatched, f"{stages[-1].name} disagrees with config.json on {mismatched}"
    params = sum(p.numel() for p in model.parameters())
    card = (MODELS / "g2p-en" / "README.md").read_text()
    assert f"{params / 1e6:.1f} M" in card, f"the model card should state {params / 1e6:.1f} M"
    for stage in stages:
        Recipe.load(stage)
        assert stage.name in card, f"the model card should name {stage.name}"
