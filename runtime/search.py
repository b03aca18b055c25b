"""Search algorithms, written once against the step interface (`runtime/step.py`).

    tokens = greedy_search(step_model, src_ids, max_new_tokens=64)   # list of id lists
    hyps = search(step_model, src_ids, GenerationOptions(beam_size=4, n_best=2))
    hyps[row][0].tokens, hyps[row][0].score                          # best hypothesis of row

`src_ids` is int64 (B, S), right-padded with `<pad>`, each row ending with `</s>`. Rows that
finish (emit `</s>`) leave the batch, so later steps compute only for live rows; in beam
search an input leaves once it has `beam_size` finished hypotheses.

Scores: `logprob` is the sum of the model's log-probabilities (temperature 1) of the emitted
tokens, `</s>` included when finished; `score = logprob / length ** length_penalty` with
length = tokens + 1 for `</s>` when finished. Beam search ranks by `score`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputTooLongError, OptionsError
from .ranking import ranked
from .step import StepModel, StepState

# (logits float32 (B, V), original row index of each live row (B,)) -> token ids int64 (B,)
Chooser = Callable[[np.ndarray, np.ndarray], np.ndarray]

# Bounds on what one generate call may hold in memory: each live hypothesis carries its own
# self-attention cache, so beam_size x batch_size hypotheses grow with both.
MAX_BEAM = 128
MAX_HYPOTHESES = 4096  # beam_size * batch_size
MAX_LENGTH_PENALTY = 10  # |length_penalty|: beyond it length ** penalty overflows or vanishes


@dataclass(frozen=True)
class GenerationOptions:
    """How to generate; impossible combinations raise OptionsError when constructed."""

    max_new_tokens: int | None = None  # None: as many as the model's max_len allows
    beam_size: int = 1  # > 1: beam search
    n_best: int = 1  # hypotheses returned per input (<= beam_size)
    length_penalty: float = 1.0  # score = logprob / length ** length_penalty
    sample: bool = False  # sample from the distribution instead of taking the arg-max
    temperature: float = 1.0  # sampling: logits / temperature (> 0)
    top_k: int = 0  # sampling: keep the k most likely tokens (0: all)
    top_p: float = 1.0  # sampling: keep the smallest set with probability >= top_p, (0, 1]
    seed: int | None = None  # sampling: same seed + same input -> same output
    batch_size: int = 32  # inputs per engine batch, in input order (int8: may change results)
    truncate: bool = False  # cut over-long sources to max_len instead of raising
    source_lang: str | None = None  # a multilingual model's code (runtime/languages.py)
    target_lang: str | None = None  # its code forced as the first token (runtime/prefix.py)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise OptionsError("invalid generation options: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every problem with these options, as readable sentences."""
        out = []

        if self.max_new_tokens is not None and not _positive_int(self.max_new_tokens):
            out.append(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        for name in ("beam_size", "n_best", "batch_size"):
            if not _positive_int(getattr(self, name)):
                out.append(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        both = _positive_int(self.n_best) and _positive_int(self.beam_size)
        if both and self.n_best > self.beam_size:
            out.append(f"n_best ({self.n_best}) cannot exceed beam_size ({self.beam_size})")
        if _positive_int(self.beam_size) and self.beam_size > MAX_BEAM:
            out.append(f"beam_size {self.beam_size} is above the limit of {MAX_BEAM}: use less")
        elif _positive_int(self.beam_size) and _positive_int(self.batch_size):
            held = self.beam_size * self.batch_size
            if held > MAX_HYPOTHESES:
                fits = max(1, MAX_HYPOTHESES // self.beam_size)
                out.append(
                    f"beam_size x batch_size is {held} hypotheses held at once, at most "
                    f"{MAX_HYPOTHESES}: lower batch_size to {fits} or less for beam_size "
                    f"{self.beam_size}"
                )
        if not _finite(self.length_penalty) or abs(self.length_penalty) > MAX_LENGTH_PENALTY:
            out.append(
                f"length_penalty must be a finite number, got {self.length_penalty!r}; use one "
                f"in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}] (usual: 0.6 to 2)"
            )
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
        if self.sample and isinstance(self.beam_size, int) and self.beam_size > 1:
            out.append("sampling and beam search exclude each other: use sample or beam_size > 1")
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

    @property
    def method(self) -> str:
        """ "beam", "sample" or "greedy"."""
        if self.beam_size > 1:
            return "beam"
        return "sample" if self.sample else "greedy"


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _finite(value: object) -> bool:
    """A finite int or float (not a bool, NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


@dataclass(frozen=True)
class Hypothesis:
    """One generated sequence of one input."""

    tokens: tuple[int, ...]  # generated ids, without `<s>` and `</s>`
    logprob: float  # sum of log-probabilities, `</s>` included when finished
    score: float  # logprob / length ** length_penalty (what beam search ranks by)
    finished: bool  # ended with `</s>` (False: stopped by max_new_tokens or max_len)


def normalized_score(logprob: float, length: int, length_penalty: float) -> float:
    """logprob / length ** length_penalty (length >= 1)."""
    return float(logprob / max(length, 1) ** length_penalty)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64: (B, V) -> (B, V)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z


def scored_step(
    model: StepModel, state: StepState, input_ids: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray | None, StepState]:
    """One decoder step on input_ids int64 (R, N) -> float64 log-probabilities of the next
    token after the last position: the k best per row (R, k), best first, with their ids
    int64 (R, k), when the model's graph returns them (its `top_width` >= k: the logits stay
    in the graph); else every token's (R, V) and None. Then the state."""
    if k <= getattr(model, "top_width", 0):
        ids, logprobs, state = model.step_top(state, input_ids, k)  # type: ignore[attr-defined]
        return logprobs, ids, state
    logits, state = model.step(state, input_ids)
    return log_softmax(logits[:, -1]), None, state


def check_source_length(model: StepModel, src_ids: np.ndarray) -> None:
    """Refuse a source longer than the model's positional table."""
    if src_ids.shape[1] > model.max_len:
        raise InputTooLongError(
            f"source has {src_ids.shape[1]} tokens but the model's max_len is {model.max_len}; "
            "shorten the input or pass truncate=True"
        )


def step_budget(model: StepModel, max_new_tokens: int | None) -> int:
    """Decoder steps allowed: max_new_tokens, at most one per target position."""
    return model.max_len if max_new_tokens is None else min(max_new_tokens, model.max_len)


# -- greedy and sampling: one token per live row per step --------------------------------------
def decode_steps(
    model: StepModel, src_ids: np.ndarray, max_new_tokens: int | None, choose: Chooser
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield, per step, (rows, token ids, log-probabilities), each (B_live,), for the rows
    still live (original row indices). A row yields `</s>` once, then leaves the batch."""
    src_ids = np.asarray(src_ids, dtype=np.int64)
    check_source_length(model, src_ids)
    state = model.start(src_ids)
    live = np.arange(src_ids.shape[0])  # original row index of each state row
    last = np.full((len(live), 1), model.bos_id, dtype=np.int64)
    for _ in range(step_budget(model, max_new_tokens)):
        if choose is choose_argmax and getattr(model, "top_width", 0) >= 1:
            top_ids, top_logprobs, state = model.step_top(state, last, 1)  # type: ignore[attr-defined]
            next_ids, logprobs = top_ids[:, 0], top_logprobs[:, 0]  # the arg-max, from the graph
        else:
            logits, state = model.step(state, last)
            logits = logits[:, -1]  # (B_live, V)
            next_ids = np.asarray(choose(logits, live), dtype=np.int64)  # (B_live,)
            logprobs = log_softmax(logits)[np.arange(len(live)), next_ids]
        yield live, next_ids, logprobs
        finished = next_ids == model.eos_id
        if finished.all():
            return
        if finished.any():
            keep = np.flatnonzero(~finished)
            state, live, next_ids = model.select(state, keep), live[keep], next_ids[keep]
        last = next_ids[:, None]


def choose_argmax(logits: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Greedy chooser: the most likely token (lowest id on ties)."""
    return logits.argmax(axis=-1)


def sample_token(
    logits: np.ndarray, rng: np.random.Generator, temperature: float, top_k: int, top_p: float
) -> int:
    """Draw one id from logits (V,) / temperature, restricted to the top_k most likely ids and
    then to the smallest most-likely set whose probability reaches top_p. One draw of `rng`."""
    z = logits.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")  # most likely first; ties by id
    z = z[order[:top_k]] if top_k else z[order]
    probs = np.exp(z - z.max())
    cumulative = np.cumsum(probs / probs.sum())
    if top_p < 1.0:
        kept = int(np.searchsorted(cumulative, top_p, side="left")) + 1
        cumulative = np.cumsum(probs[:kept] / probs[:kept].sum())
    u = rng.random()
    index = min(int(np.searchsorted(cumulative, u, side="right")), len(cumulative) - 1)
    return int(order[index])


def sampling_chooser(options: GenerationOptions, rngs: Sequence[np.random.Generator]) -> Chooser:
    """Sampling chooser; row r draws from rngs[r] only, so a row's tokens do not depend on
    which other rows share the batch."""

    def choose(logits: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return np.array(
            [
                sample_token(row_logits, rngs[r], options.temperature, options.top_k, options.top_p)
                for row_logits, r in zip(logits, rows, strict=True)
            ],
            dtype=np.int64,
        )

    return choose


def token_search(
    model: StepModel,
    src_ids: np.ndarray,
    max_new_tokens: int | None,
    choose: Chooser,
    length_penalty: float = 1.0,
) -> list[Hypothesis]:
    """Greedy or sampled decoding with `choose`: one Hypothesis per row of src_ids (B, S)."""
    batch = src_ids.shape[0]
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprob = np.zeros(batch)
    finished = np.zeros(batch, dtype=bool)
    for rows, next_ids, logprobs in decode_steps(model, src_ids, max_new_tokens, choose):
        for row, token, lp in zip(rows, next_ids, logprobs, strict=True):
            logprob[row] += lp
            if token == model.eos_id:
                finished[row] = True
            else:
                tokens[row].append(int(token))
    return [
        Hypothesis(
            tuple(tokens[r]),
            float(logprob[r]),
            normalized_score(logprob[r], len(tokens[r]) + finished[r], length_penalty),
            bool(finished[r]),
        )
        for r in range(batch)
    ]


def greedy_search(model: StepModel, src_ids: np.ndarray, max_new_tokens: int) -> list[list[int]]:
    """Arg-max decoding. src_ids int64 (B, S) right-padded -> generated ids per row
    (without `<s>` and `</s>`), at most `max_new_tokens` each and within `max_len` positions."""
    hyps = token_search(model, np.asarray(src_ids), max_new_tokens, choose_argmax)
    return [list(h.tokens) for h in hyps]


# -- beam search --------------------------------------------------------------------------------
def beam_search(
    model: StepModel,
    src_ids: np.ndarray,
    beam_size: int,
    max_new_tokens: int | None = None,
    length_penalty: float = 1.0,
    n_best: int = 1,
) -> list[list[Hypothesis]]:
    """Beam search over src_ids int64 (B, S) -> per row, up to n_best hypotheses, best first.

    Each step, an input's candidates (live hypothesis x next token) are ranked by summed
    log-probability; a `</s>` candidate among the top `beam_size` finishes a hypothesis, the
    best `beam_size` other candidates live on. An input stops once it has `beam_size` finished
    hypotheses before the last step; at the step budget its live beams count as unfinished
    hypotheses (also when its last step finished the `beam_size`-th hypothesis). With
    beam_size 1 this is exactly greedy search.
    """
    src_ids = np.asarray(src_ids, dtype=np.int64)
    check_source_length(model, src_ids)
    batch = src_ids.shape[0]
    state = model.start(src_ids)
    # One state row per live hypothesis, grouped by input: its input, tokens and logprob.
    row_input = list(range(batch))
    row_tokens: list[list[int]] = [[] for _ in range(batch)]
    row_logprob = np.zeros(batch)
    done: list[list[Hypothesis]] = [[] for _ in range(batch)]
    last = np.full((batch, 1), model.bos_id, dtype=np.int64)
    budget = step_budget(model, max_new_tokens)
    for step in range(budget):
        candidates, ids, state = scored_step(model, state, last, 2 * beam_size)  # (R, K)
        candidates += row_logprob[:, None]
        width = candidates.shape[1]
        keep_rows: list[int] = []
        keep_tokens: list[int] = []
        keep_logprob: list[float] = []
        for start, top, values in ranked(candidates, row_input, 2 * beam_size):
            item = row_input[start]
            first, alive = len(keep_rows), 0
            for rank, (index, value) in enumerate(zip(top, values, strict=True)):
                if value == -math.inf:  # a token a forced prefix rules out (runtime/prefix.py)
                    break
                row, column = start + index // width, index % width
                token = column if ids is None else int(ids[row, column])
                if token == model.eos_id:
                    if rank < beam_size:
                        length = len(row_tokens[row]) + 1
                        score = normalized_score(value, length, length_penalty)
                        done[item].append(Hypothesis(tuple(row_tokens[row]), value, score, True))
                    continue
                keep_rows.append(row)
                keep_tokens.append(token)
                keep_logprob.append(value)
                alive += 1
                if alive == beam_size:
                    break
            # Input finished: drop its live candidates, except at the last step, where they
            # compete as unfinished hypotheses (as in transformers and onnxruntime).
            if len(done[item]) >= beam_size and step < budget - 1:
                del keep_rows[first:], keep_tokens[first:], keep_logprob[first:]
        if not keep_rows:
            return _best(done, n_best)
        row_input = [row_input[r] for r in keep_rows]
        row_tokens = [[*row_tokens[r], t] for r, t in zip(keep_rows, keep_tokens, strict=True)]
        row_logprob = np.array(keep_logprob)
        state = model.select(state, np.array(keep_rows, dtype=np.int64))
        last = np.array(keep_tokens, dtype=np.int64)[:, None]
    for item, tokens, lp in zip(row_input, row_tokens, row_logprob, strict=True):
        score = normalized_score(lp, len(tokens), length_penalty)
        done[item].append(Hypothesis(tuple(tokens), float(lp), score, False))
    return _best(done, n_best)


def _best(done: list[list[Hypothesis]], n_best: int) -> list[list[Hypothesis]]:
    """Each input's hypotheses by descending score (stable), cut to n_best."""
    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in done]


# -- one entry point ----------------------------------------------------------------------------
def row_rngs(options: GenerationOptions, keys: Sequence[int]) -> list[np.random.Generator]:
    """One numpy Generator per row, seeded by (options.seed, key): reproducible per input.
    Fresh entropy when options.seed is None."""
    if options.seed is None:
        return [np.random.default_rng() for _ in keys]
    return [np.random.default_rng([options.seed, int(key)]) for key in keys]


def search(
    model: StepModel,
    src_ids: np.ndarray,
    options: GenerationOptions,
    rngs: Sequence[np.random.Generator] | None = None,
) -> list[list[Hypothesis]]:
    """Run the search `options` ask for on src_ids int64 (B, S) -> hypotheses per row, best
    first (one for greedy and sampling, up to n_best for beam). `rngs`: one per row for
    sampling (default: seeded by options.seed and the row index)."""
    if options.method == "beam":
        return beam_search(
            model,
            src_ids,
            options.beam_size,
            options.max_new_tokens,
            options.length_penalty,
            options.n_best,
        )
    if options.method == "sample":
        rngs = rngs if rngs is not None else row_rngs(options, range(src_ids.shape[0]))
        choose = sampling_chooser(options, rngs)
    else:
        choose = choose_argmax
    hyps = token_search(model, src_ids, options.max_new_tokens, choose, options.length_penalty)
    return [[h] for h in hyps]
