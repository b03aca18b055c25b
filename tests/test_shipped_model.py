"""The embedded default, `models/g2p-en`: inside its size budget, loadable, of a shape that a
recipe in `models/recipes/` builds, and with its parameter count stated in its model card."""

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
    recipes = [Recipe.load(p) for p in sorted((MODELS / "recipes").glob("*.json"))]
    assert any(
        all(getattr(model.cfg, key) == value for key, value in r.model.items()) for r in recipes
    ), "no recipe in models/recipes/ has every model field of models/g2p-en/config.json"
    params = sum(p.numel() for p in model.parameters())
    card = (MODELS / "g2p-en" / "README.md").read_text()
    assert f"{params / 1e6:.1f} M" in card, f"the model card should state {params / 1e6:.1f} M"
