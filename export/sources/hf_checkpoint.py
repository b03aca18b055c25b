"""What the Hugging Face adapters (m2m_100.py, t5.py) share: config.json read and checked
against the adapter's model types, and a state_dict read by name that remembers what the
weight map used.

    config = read_hf_config(path, ("t5", "mt5"), "t5")    # SourceError unless one of them
    weights = SourceWeights(read_weights(path), "T5")
    weights.take("shared.weight")                          # SourceError naming a missing key
    weights.check_all_used({"lm_head.weight": "shared.weight"})   # aliases must be equal
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import ADAPTERS, SourceError


def config_model_type(path: Path) -> str | None:
    """config.json's model_type, None when there is no readable config.json."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def read_hf_config(path: Path, model_types: Iterable[str], adapter: str) -> dict[str, Any]:
    """config.json as a dict, refused unless its model_type is one of `model_types`."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except OSError:
        raise SourceError(f"{path} has no config.json (not a save_pretrained directory)") from None
    except ValueError as exc:
        raise SourceError(f"{path / 'config.json'} is not valid JSON: {exc}") from None
    types = tuple(model_types)
    if not isinstance(config, dict) or config.get("model_type") not in types:
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise SourceError(
            f"config.json model_type is {kind!r}; the {adapter} adapter reads model_type "
            f"{' or '.join(types)} only (source formats: {', '.join(sorted(ADAPTERS))})"
        )
    return config


class SourceWeights:
    """A source state_dict read by name; remembers which keys the weight map used."""

    def __init__(self, state: dict[str, Tensor], family: str) -> None:
        self.state, self.family, self.used = state, family, set()

    def take(self, key: str) -> Tensor:
        """The tensor `key`, marked used; SourceError when the weights lack it."""
        if key not in self.state:
            raise SourceError(f"the weights lack {key}")
        self.used.add(key)
        return self.state[key]

    def check_all_used(self, aliases: Mapping[str, str], ignored: Iterable[str] = ()) -> None:
        """Refuse weights the map did not use, except copies of a table it used (`aliases`:
        key -> the key it must equal) and keys the source itself ignores (`ignored`)."""
        skip = set(ignored)
        for key in sorted(set(self.state) - self.used - skip):
            if key not in aliases:
                raise SourceError(
                    f"the weights hold {key}, which the {self.family} map does not use"
                )
            if not torch.equal(self.state[key], self.state[aliases[key]]):
                raise SourceError(f"the weights' {key} differs from {aliases[key]}")
