"""`GenerationOptions`: how to generate, checked when constructed (re-exported by
runtime/search.py, where the searches that read them live).

    options = GenerationOptions(beam_size=4, n_best=2)          # OptionsError if impossible
    options.filled(bundle.generation)      # unset fields: the model's defaults, else edgeseq's

A field left at None is unset: `filled` takes it from the bundle's recorded generation
settings (config.json "generation", docs/bundle.md), else from `BUILTIN_DEFAULTS`. A value
the caller gives always wins. `Generator` fills the options before every search, so the
API, the CLI and the server resolve them the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import OptionsError

# Bounds on what one generate call may hold in memory: each live hypothesis carries its own
# self-attention cache, so beam_size x batch_size hypotheses grow with both.
MAX_BEAM = 128
MAX_HYPOTHESES = 4096  # beam_size * batch_size
MAX_LENGTH_PENALTY = 10  # |length_penalty|: beyond it length ** penalty overflows or vanishes
EARLY_STOPPING_CHOICES = (True, False, "never")

# What an unset field becomes when the bundle records no generation setting for it.
BUILTIN_DEFAULTS: dict[str, Any] = {
    "beam_size": 1,
    "length_penalty": 1.0,
    "early_stopping": True,
    "no_repeat_ngram_size": 0,
    "min_new_tokens": 0,
    "bad_words_ids": (),
    "forced_eos": False,
    "renormalize": False,
}
# The fields a bundle's "generation" object may set (max_new_tokens: None there means the
# model's max_len).
MODEL_DEFAULTS = ("max_new_tokens", *BUILTIN_DEFAULTS)
# Token rules the search applies to every step's log-probabilities (runtime/rules.py).
RULE_FIELDS = ("no_repeat_ngram_size", "min_new_tokens", "bad_words_ids", "forced_eos")


@dataclass(frozen=True)
class GenerationOptions:
    """How to generate; impossible combinations raise OptionsError when constructed.
    None: unset, the model's default (`filled`)."""

    max_new_tokens: int | None = None  # None: the model's default, else its max_len
    beam_size: int | None = None  # > 1: beam search (default 1; sampling: always 1)
    n_best: int = 1  # hypotheses returned per input (<= beam_size)
    length_penalty: float | None = None  # score = logprob / length ** length_penalty (1.0)
    # beam search stops an input at beam_size finished hypotheses (True); False: while a live
    # beam, scored at its current length, could still beat the worst of them (transformers'
    # default heuristic); "never": at its longest possible length when length_penalty > 0
    early_stopping: bool | str | None = None
    no_repeat_ngram_size: int | None = None  # > 0: no n-gram of that size twice in an output
    min_new_tokens: int | None = None  # `</s>` banned before this many tokens (0)
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None  # target id sequences never output
    forced_eos: bool | None = None  # the last step of the length budget emits `</s>` (False)
    renormalize: bool | None = None  # log-softmax again after the rules (transformers'
    # renormalize_logits; False: banned tokens' probability is not given back to the others)
    sample: bool = False  # sample from the distribution instead of taking the arg-max
    temperature: float = 1.0  # sampling: logits / temperature (> 0)
    top_k: int = 0  # sampling: keep the k most likely tokens (0: all)
    top_p: float = 1.0  # sampling: keep the smallest set with probability >= top_p, (0, 1]
    seed: int | None = None  # sampling: same seed + same input -> same output
    batch_size: int = 32  # inputs per engine batch, in input order (int8: may change results)
    truncate: bool = False  # cut over-long sources to max_len instead of raising
    source_lang: str | None = None  # a multilingual model's code (runtime/languages.py)
    target_lang: str | None = None  # its code forced as the first token (runtime/prefix.py)
    # text every output starts with: its target-tokenizer ids forced after the target language
    target_prefix: str | None = None
    split_sentences: bool = False  # generate each sentence of an input, joined (sentences.py)
    # a task of the bundle's task_prefixes (T5's task_specific_params): its text goes before
    # every input (each sentence with split_sentences)
    task: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.bad_words_ids, (list, tuple)):  # JSON gives lists: keep it hashable
            words = self.bad_words_ids
            words = tuple(tuple(w) if isinstance(w, (list, tuple)) else w for w in words)
            object.__setattr__(self, "bad_words_ids", words)
        problems = self.problems()
        if problems:
            raise OptionsError("invalid generation options: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every problem with these options, as readable sentences."""
        out = []
        if self.max_new_tokens is not None and not _positive_int(self.max_new_tokens):
            out.append(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        for name in ("beam_size", "n_best", "batch_size"):
            value = getattr(self, name)
            if value is not None and not _positive_int(value):
                out.append(f"{name} must be a positive integer, got {value!r}")
        beam = self.beam_size if _positive_int(self.beam_size) else None
        if beam is not None and _positive_int(self.n_best) and self.n_best > beam:
            out.append(f"n_best ({self.n_best}) cannot exceed beam_size ({beam})")
        if beam is not None and beam > MAX_BEAM:
            out.append(f"beam_size {beam} is above the limit of {MAX_BEAM}: use less")
        elif beam is not None and _positive_int(self.batch_size):
            held = beam * self.batch_size
            if held > MAX_HYPOTHESES:
                fits = max(1, MAX_HYPOTHESES // beam)
                out.append(
                    f"beam_size x batch_size is {held} hypotheses held at once, at most "
                    f"{MAX_HYPOTHESES}: lower batch_size to {fits} or less for beam_size {beam}"
                )
        penalty = self.length_penalty
        if penalty is not None and (not _finite(penalty) or abs(penalty) > MAX_LENGTH_PENALTY):
            out.append(
                f"length_penalty must be a finite number, got {penalty!r}; use one "
                f"in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}] (usual: 0.6 to 2)"
            )
        out += self._rule_problems()
        if not _finite(self.temperature) or not self.temperature > 0:
            out.append(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            out.append(f"top_k must be an integer >= 0 (0: no limit), got {self.top_k!r}")
        if not _finite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            out.append(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            out.append(f"seed must be a non-negative integer, got {self.seed!r}")
        for name, value in (("source_lang", self.source_lang), ("target_lang", self.target_lang)):
            if value is not None and (not isinstance(value, str) or not value):
                out.append(f"{name} must be a language code (a string), got {value!r}")
        if self.target_prefix is not None and (
            not isinstance(self.target_prefix, str) or not self.target_prefix.strip()
        ):
            out.append(f"target_prefix must be a non-empty text, got {self.target_prefix!r}")
        if self.split_sentences and self.target_prefix:
            out.append("target_prefix starts a whole output: leave out split_sentences")
        if self.sample and beam is not None and beam > 1:
            out.append("sampling and beam search exclude each other: use sample or beam_size > 1")
        if self.split_sentences and self.n_best != 1:
            out.append("split_sentences joins one output per input: use n_best 1")
        if not self.sample:
            changed = [
                name
                for name, default in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0))
                if getattr(self, name) != default
            ]
            changed += ["seed"] if self.seed is not None else []
            if changed:
                out.append(f"{', '.join(changed)} only apply with sample=True")
        return out

    def _rule_problems(self) -> list[str]:
        """Problems with the token rules and beam-search stopping fields."""
        out = []
        stop = self.early_stopping
        if stop is not None and not (isinstance(stop, bool) or stop == "never"):
            out.append(f"early_stopping must be true, false or 'never', got {stop!r}")
        for name in ("no_repeat_ngram_size", "min_new_tokens"):
            value = getattr(self, name)
            if value is not None and _negative_or_not_int(value):
                out.append(f"{name} must be an integer >= 0 (0: off), got {value!r}")
        for name in ("forced_eos", "renormalize", "sample", "truncate", "split_sentences"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                out.append(f"{name} must be true or false, got {value!r}")
        words = self.bad_words_ids
        if words is not None and not (isinstance(words, tuple) and all(map(_id_list, words))):
            out.append(f"bad_words_ids must be a list of non-empty lists of ids, got {words!r}")
        return out

    @property
    def method(self) -> str:
        """ "beam", "sample" or "greedy"."""
        if self.beam_size is not None and self.beam_size > 1:
            return "beam"
        return "sample" if self.sample else "greedy"

    @property
    def has_rules(self) -> bool:
        """Whether a token rule (runtime/rules.py) applies: only the Python loop runs them."""
        rules = (self.no_repeat_ngram_size, self.min_new_tokens, self.bad_words_ids)
        return bool(any(rules) or self.forced_eos)

    def unset(self) -> tuple[str, ...]:
        """The fields left at None that a model's generation settings may fill."""
        return tuple(name for name in MODEL_DEFAULTS if getattr(self, name) is None)

    def filled(self, model_defaults: Mapping[str, Any] | None = None) -> GenerationOptions:
        """These options with every unset field (None) taken from `model_defaults` (a
        bundle's "generation" object), else from BUILTIN_DEFAULTS; with sampling the beam size
        is 1 whatever the model's default. OptionsError if the result is impossible (e.g.
        n_best above the model's beam size)."""
        model = dict(model_defaults or {})
        if self.sample:
            model.pop("beam_size", None)
        values = {}
        for name in self.unset():
            if model.get(name) is not None:
                values[name] = model[name]
            elif name in BUILTIN_DEFAULTS:
                values[name] = BUILTIN_DEFAULTS[name]
        return replace(self, **values) if values else self


def _id_list(value: object) -> bool:
    """A non-empty tuple of token ids (integers >= 0)."""
    return isinstance(value, tuple) and bool(value) and not any(map(_negative_or_not_int, value))


def _negative_or_not_int(value: object) -> bool:
    return not isinstance(value, int) or isinstance(value, bool) or value < 0


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _finite(value: object) -> bool:
    """A finite int or float (not a bool, NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


OPTION_FIELDS = tuple(f.name for f in fields(GenerationOptions))
