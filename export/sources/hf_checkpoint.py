"""What every Hugging Face BART-family checkpoint directory (`save_pretrained`'s layout:
Marian, M2M-100, BART, mBART) is read with: config.json by model_type, the stack fields and
their checks, the weights file.

    config_model_type(path)                                    # "marian" (None: unreadable)
    config = read_typed_config(path, ("marian",), "marian")    # SourceError naming the type
    check_stacks(config, {"relu": "relu"})                     # activation, heads, FFN widths
    ModelConfig(**stack_fields(config), ...)                   # d_model, heads, layers, ...
    state = read_weights(path)                                 # model.safetensors or .bin
    weights = SourceWeights(state, "T5")                       # take by name, check all used
    model = empty_model(cfg)                                   # one table for both stacks
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime.config import ModelConfig

from . import ADAPTERS, SourceError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def config_model_type(path: Path) -> str | None:
    """config.json's model_type, None when unreadable (for `detect`)."""
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def read_typed_config(path: Path, model_types: tuple[str, ...], adapter: str) -> dict[str, Any]:
    """config.json of a save_pretrained directory, refused unless its model_type is one of
    `model_types` (the `adapter` reads them)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except OSError:
        raise SourceError(f"{path} has no config.json (not a save_pretrained directory)") from None
    except ValueError as exc:
        raise SourceError(f"{path / 'config.json'} is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or config.get("model_type") not in model_types:
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise SourceError(
            f"config.json model_type is {kind!r}; the {adapter} adapter reads model_type "
            f"{' or '.join(model_types)} only (source formats: {', '.join(sorted(ADAPTERS))})"
        )
    return config


def check_stacks(config: dict[str, Any], activations: dict[str, str]) -> None:
    """Refuse a BART-family config.json (Marian, M2M-100, BART) whose activation is not in
    `activations` or whose encoder and decoder differ in heads or FFN width."""
    activation = config["activation_function"]
    if activation not in activations:
        raise SourceError(
            f"config.json activation_function {activation!r} is not mapped (edgeseq has "
            f"{', '.join(activations)}): use a checkpoint with one of them"
        )
    for ours, enc, dec in (
        ("n_heads", "encoder_attention_heads", "decoder_attention_heads"),
        ("d_ff", "encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(enc) != config.get(dec):
            raise SourceError(f"config.json {enc} != {dec}: edgeseq needs one {ours} for both")


def stack_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of a BART-family config.json's stacks (Marian, M2M-100): widths,
    heads, layers, positions; dropout off (export runs the model in eval mode)."""
    return {
        "d_model": config["d_model"],
        "n_heads": config["encoder_attention_heads"],
        "n_encoder_layers": config["encoder_layers"],
        "n_decoder_layers": config["decoder_layers"],
        "d_ff": config["encoder_ffn_dim"],
        "dropout": 0.0,
        "max_len": config["max_position_embeddings"],
    }


def weights_file(path: Path) -> Path:
    """model.safetensors, else pytorch_model.bin (SourceError when neither exists)."""
    file = next((path / name for name in WEIGHT_FILES if (path / name).is_file()), None)
    if file is None:
        raise SourceError(f"{path} has neither {' nor '.join(WEIGHT_FILES)}")
    return file


def read_weights(path: Path) -> dict[str, Tensor]:
    """model.safetensors, else pytorch_model.bin read with torch.load(weights_only=True)."""
    file = weights_file(path)
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(file))
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle errors of many kinds
        raise SourceError(
            f"{file} cannot be read with torch.load(weights_only=True) ({str(exc).splitlines()[0]})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise SourceError(f"{file} is not a state_dict of tensors")
    return state


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


def empty_model(cfg: ModelConfig) -> Seq2SeqTransformer:
    """A Seq2SeqTransformer of `cfg` whose parameters are allocated but not initialised, the
    target embedding (and a tied output projection) the same Parameter as the source
    embedding: for a checkpoint whose stacks share one token table, which the caller writes
    with every other parameter (`check_written`). Nothing is drawn at random and a
    vocabulary-sized table is held once, not three times: an NLLB-200-sized table is 1 GB."""
    with torch.device("meta"):
        model = Seq2SeqTransformer(cfg).to_empty(device="cpu")  # memory not touched yet
    model.tgt_embed.weight = model.src_embed.weight  # tied after to_empty, which unties
    if cfg.tie_output:
        model.output.weight = model.src_embed.weight
    return model


def check_written(model: torch.nn.Module, written: Iterable[str]) -> None:
    """Internal check of an `empty_model`'s filling: every parameter was written (its memory
    holds no uninitialised values) and the model has no buffer (`to_empty` left them so)."""
    missing = sorted({name for name, _ in model.named_parameters()} - set(written))
    buffers = [name for name, _ in model.named_buffers()]
    assert not missing and not buffers, (missing, buffers)
