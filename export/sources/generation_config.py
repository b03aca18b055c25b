"""A Hugging Face checkpoint's generation settings, as a bundle records them (config.json
"generation", docs/bundle.md): the defaults of `edgeseq generate` for that model, so that it
prints what `pipeline("translation")` prints.

    record = read_generation(path, to_edgeseq, eos_id=0, never_generated={0, 1})
    record.settings   # {"beam_size": 4, "early_stopping": False, "forced_eos": True, ...}
    record.ignored    # one line per setting edgeseq does not implement, printed at export

Read from the directory's generation_config.json, else from config.json's generation keys
(transformers' `GenerationConfig.from_model_config` does the same). Kept, in
GenerationOptions terms (runtime/options.py): num_beams -> beam_size, length_penalty,
early_stopping (transformers' default False when the checkpoint sets beams but not it),
max_new_tokens, else max_length - 1 (transformers counts the decoder start),
min_new_tokens / min_length - 1 -> min_new_tokens, no_repeat_ngram_size, bad_words_ids (in
edgeseq ids, `[</s>]` dropped as transformers drops it, one-token bans of ids the graph never
outputs dropped: `never_generated`), forced_eos_token_id = `</s>` -> forced_eos,
renormalize_logits -> renormalize. A key the adapter implements itself (`handled`, e.g.
M2M-100's forced_bos_token_id: the target language) is left to it. Every other setting that
changes transformers' output from its defaults is named in `ignored`, never dropped silently.

Adapters' references call transformers' generate with `parity_generate_kwargs`: parity
level 3 compares the search of both engines under the same explicit settings, not the
checkpoint's defaults.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeseq.runtime.errors import EdgeseqError, OptionsError
from edgeseq.runtime.options import GenerationOptions

GENERATION_FILE = "generation_config.json"
# transformers' values when a checkpoint leaves a key out (GenerationConfig's defaults).
HF_DEFAULTS: dict[str, Any] = {
    "max_length": 20, "min_length": 0, "do_sample": False, "early_stopping": False,
    "num_beams": 1, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "typical_p": 1.0,
    "repetition_penalty": 1.0, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "num_return_sequences": 1,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "remove_invalid_values": False,
    "exponential_decay_length_penalty": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "encoder_repetition_penalty": 1.0, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "max_new_tokens": None, "min_new_tokens": None, "renormalize_logits": False,
    "min_p": None, "sequence_bias": None, "guidance_scale": None, "force_words_ids": None,
    "constraints": None, "penalty_alpha": None, "dola_layers": None, "max_time": None,
    "stop_strings": None, "token_healing": False, "watermarking_config": None,
}  # fmt: skip
# Keys that do not change which tokens are generated (ids the adapter maps, bookkeeping).
NOT_SETTINGS = frozenset(
    {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "use_cache"}
    | {"transformers_version", "_from_model_config", "return_dict_in_generate"}
    | {"output_scores", "output_logits", "output_attentions", "output_hidden_states"}
    | {"cache_implementation", "cache_config", "compile_config", "disable_compile"}
    | {"is_assistant", "low_memory"}
)
# What the reference's generate runs with besides its beam size, length penalty, early
# stopping and forced </s>: none of the checkpoint's bans, penalties or length floors
# (min_new_tokens 0 overrides any min_length; min_length 0 beside it would make transformers
# warn "Both `min_new_tokens` and `min_length` seem to have been set" at every call).
PARITY_NEUTRAL: dict[str, Any] = {
    "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "min_length": None,
    "min_new_tokens": 0, "repetition_penalty": 1.0, "renormalize_logits": False,
}  # fmt: skip


# edgeseq's beam search stops an input at beam_size finished hypotheses, length penalty 1
BEAM_OPTIONS = {"length_penalty": 1.0, "early_stopping": True}


def parity_generate_kwargs(
    beam_size: int, max_new_tokens: int, bad_words_ids: list[list[int]] | None = None
) -> dict[str, Any]:
    """The keyword arguments every adapter's reference passes to transformers' `generate`
    for parity level 3: greedy or beam search as edgeseq's (early stopping at `beam_size`
    finished hypotheses, length penalty 1), `max_new_tokens` new tokens, no sampling, no
    `</s>` forced at the cap, the checkpoint's other rules off (PARITY_NEUTRAL);
    `bad_words_ids` in the source's ids (Marian bans its `<pad>`)."""
    search = BEAM_OPTIONS | {"num_beams": beam_size}
    return {
        "max_new_tokens": max_new_tokens,
        "max_length": None,  # the checkpoint's generation_config may set one: ours rules
        "do_sample": False,
        "forced_eos_token_id": None,
        "num_return_sequences": 1,
        "bad_words_ids": bad_words_ids,
        **PARITY_NEUTRAL,
        **(search if beam_size > 1 else {"num_beams": 1}),
    }


@dataclass(frozen=True)
class GenerationRecord:
    """The settings a bundle records (GenerationOptions fields) and the lines naming the
    settings that are not implemented (or could not be mapped)."""

    settings: dict[str, Any] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()


def source_settings(path: Path) -> tuple[str, dict[str, Any]]:
    """(where they came from, the generation keys) of a checkpoint directory:
    generation_config.json, else config.json's keys that transformers reads as generation
    settings; ("", {}) when neither has any."""
    for name, keep_all in ((GENERATION_FILE, True), ("config.json", False)):
        try:
            data = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        known = set(HF_DEFAULTS) | NOT_SETTINGS
        data = {k: v for k, v in data.items() if v is not None and (keep_all or k in known)}
        if keep_all or any(k in HF_DEFAULTS for k in data):
            return name, data
    return "", {}


def read_generation(
    path: Path,
    to_edgeseq: Callable[[int], int],
    eos_id: int,
    never_generated: Collection[int] = (),
    handled: Collection[str] = (),
) -> GenerationRecord:
    """The generation settings of the checkpoint at `path` (see the module docstring).
    `to_edgeseq` maps a source token id to edgeseq's (raising an EdgeseqError for an id
    outside the vocabulary), `eos_id` is the source's `</s>`, `never_generated` the edgeseq
    ids the adapter's graph never outputs, `handled` the keys the adapter maps itself."""
    where, raw = source_settings(path)
    settings: dict[str, Any] = {}
    ignored: list[str] = []

    def skip(key: str, why: str) -> None:
        ignored.append(f"{where}: {key} {raw[key]!r} {why}: ignored")

    active = {k: v for k, v in raw.items() if k not in NOT_SETTINGS and k not in handled}
    active = {k: v for k, v in active.items() if k not in HF_DEFAULTS or v != HF_DEFAULTS[k]}
    mapped = {"num_beams": "beam_size", "length_penalty": "length_penalty"}
    mapped |= {"early_stopping": "early_stopping", "no_repeat_ngram_size": "no_repeat_ngram_size"}
    mapped |= {"renormalize_logits": "renormalize", "max_new_tokens": "max_new_tokens"}
    for key, ours in mapped.items():
        if key in active:
            settings[ours] = active.pop(key)
    if "max_length" in active:
        length = active.pop("max_length")
        if "max_new_tokens" not in settings and isinstance(length, int) and length > 1:
            settings["max_new_tokens"] = length - 1  # transformers counts the decoder start
    floors = [active.pop("min_new_tokens", 0), active.pop("min_length", 1) - 1]
    if max(floors, default=0) > 0:
        settings["min_new_tokens"] = max(floors)
    if "forced_eos_token_id" in active:
        forced = active.pop("forced_eos_token_id")
        if forced == eos_id or forced == [eos_id]:
            settings["forced_eos"] = True
        else:
            skip("forced_eos_token_id", "(a token other than </s>) is not implemented")
    if "bad_words_ids" in active:
        words = _bad_words(active.pop("bad_words_ids"), to_edgeseq, eos_id, never_generated)
        if words is None:
            skip("bad_words_ids", "is not a list of token id lists")
        elif words:
            settings["bad_words_ids"] = words
    if settings.get("beam_size", 1) > 1 and "early_stopping" not in settings:
        settings["early_stopping"] = HF_DEFAULTS["early_stopping"]
    for key in sorted(active):
        skip(key, "is not implemented by edgeseq")
    try:
        GenerationOptions(**settings)
    except (OptionsError, TypeError) as exc:
        ignored.append(f"{where}: generation settings {settings} cannot be used ({exc}): ignored")
        settings = {}
    return GenerationRecord(settings, tuple(ignored))


def _bad_words(
    words: Any,
    to_edgeseq: Callable[[int], int],
    eos_id: int,
    never_generated: Collection[int],
) -> list[list[int]] | None:
    """bad_words_ids in edgeseq ids, less `[</s>]` (transformers drops it) and one-token bans
    of `never_generated` ids; None when `words` is not a list of id lists or an id is not in
    the vocabulary."""
    if not isinstance(words, list) or not all(isinstance(w, list) and w for w in words):
        return None
    out = []
    for word in words:
        if word == [eos_id]:
            continue
        try:
            ids = [to_edgeseq(int(i)) for i in word]
        except (EdgeseqError, TypeError, ValueError):
            return None
        if len(ids) == 1 and ids[0] in never_generated:
            continue
        out.append(ids)
    return out
