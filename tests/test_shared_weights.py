"""export/shared_weights.py: our model reads the weights it shares with the source model
from the source's tensors, ties kept, values and outputs unchanged."""

from __future__ import annotations

import torch
from torch import nn

from edgeseq.export.shared_weights import adopt_equal_tensors


class Tied(nn.Module):
    """An embedding tied to an output projection, a hidden layer and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.hidden = nn.Linear(8, 8)
        self.out = nn.Linear(8, 50, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(1.0, 2.0, 8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids int64 (B, T) -> logits (B, T, 50)."""
        return self.out(self.hidden(self.embed(ids)) * self.scale)


def test_equal_tensors_become_views_of_the_source_and_ties_hold() -> None:
    torch.manual_seed(0)
    ours, source = Tied(), Tied()
    source.load_state_dict(ours.state_dict())
    with torch.no_grad():
        source.hidden.bias[3] += 1.0  # one tensor differs: it keeps its own copy
    ids = torch.randint(0, 50, (2, 5))
    before = ours(ids).detach()

    saved = adopt_equal_tensors(ours, source)

    assert ours.embed.weight.data_ptr() == source.embed.weight.data_ptr()
    assert ours.out.weight is ours.embed.weight  # the tie is kept in both modules
    assert ours.hidden.weight.data_ptr() == source.hidden.weight.data_ptr()
    assert ours.scale.data_ptr() == source.scale.data_ptr()
    assert ours.hidden.bias.data_ptr() != source.hidden.bias.data_ptr()
    assert isinstance(ours.hidden.weight, nn.Parameter)
    assert saved == 4 * (50 * 8 + 8 * 8 + 8)  # the table once, not per module holding it
    assert torch.equal(ours(ids), before)


def test_nothing_shared_between_different_models() -> None:
    torch.manual_seed(0)
    ours = Tied()
    torch.manual_seed(1)
    other = nn.Sequential(nn.Linear(8, 8), nn.Embedding(50, 8))
    pointers = [p.data_ptr() for p in ours.parameters()]
    assert adopt_equal_tensors(ours, other) == 0
    assert [p.data_ptr() for p in ours.parameters()] == pointers
