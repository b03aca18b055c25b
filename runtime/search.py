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

from .errors import InputTooLongError
from .options import MAX_BEAM as MAX_BEAM
from .options import MAX_HYPOTHESES as MAX_HYPOTHESES
from .options import MAX_LENGTH_PENALTY as MAX_LENGTH_PENALTY
from .options import GenerationOptions
from .ranking import ranked
from .rules import log_softmax, with_rules
from .step import StepModel, StepState, max_positions

# (logits float32 (B, V), original row index of each live row (B,)) -> token ids int64 (B,)
Chooser = Callable[[np.ndarray, np.ndarray], np.ndarray]


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
    return to_logprobs(model, logits[:, -1]), None, state


def to_logprobs(model: StepModel, logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities (B, V) of a step's logits (B, V): the values themselves when
    the model gives log-probabilities already (`gives_logprobs`, runtime/rules.py), else
    their log-softmax."""
    if getattr(model, "gives_logprobs", False):
        return logits.astype(np.float64)
    return log_softmax(logits)


def check_source_length(model: StepModel, src_ids: np.ndarray) -> None:
    """Refuse a source longer than the model's positional table."""
    if src_ids.shape[1] > max_positions(model):
        raise InputTooLongError(
            f"source has {src_ids.shape[1]} tokens but the model's max_len is "
            f"{max_positions(model)}; "
            "shorten the input or pass truncate=True"
        )


def step_budget(model: StepModel, max_new_tokens: int | None) -> int:
    """Decoder steps allowed: max_new_tokens (default max_len), at most one per target
    position (`max_positions`: past max_len for positional "relative")."""
    if max_new_tokens is None:
        return model.max_len
    return min(max_new_tokens, max_positions(model))


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
            logprobs = to_logprobs(model, logits)[np.arange(len(live)), next_ids]
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
    early_stopping: bool | str = True,
) -> list[list[Hypothesis]]:
    """Beam search over src_ids int64 (B, S) -> per row, up to n_best hypotheses, best first.

    Each step, an input's candidates (live hypothesis x next token) are ranked by summed
    log-probability; a `</s>` candidate among the top `beam_size` finishes a hypothesis, the
    best `beam_size` other candidates live on. An input stops before the last step once it has
    `beam_size` finished hypotheses and (`early_stopping` False or "never", as transformers)
    its best live beam cannot beat the worst of the best `beam_size` of them (`_input_done`);
    at the step budget its live beams count as unfinished hypotheses (also when its last step
    finished the `beam_size`-th hypothesis). With beam_size 1 this is exactly greedy search.
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
            best_live = keep_logprob[first] if len(keep_rows) > first else None
            length = budget if early_stopping == "never" and length_penalty > 0 else step + 1
            how = (early_stopping, length_penalty)
            if step < budget - 1 and _input_done(done[item], beam_size, best_live, length, *how):
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


def _input_done(
    done: list[Hypothesis],
    beam_size: int,
    best_live: float | None,
    length: int,
    early_stopping: bool | str,
    length_penalty: float = 1.0,
) -> bool:
    """Whether an input with finished hypotheses `done` and best live logprob `best_live`
    stops: at beam_size finished with early_stopping True; else also only when the best live
    beam scored at `length` is not above the beam_size-th best finished score."""
    if len(done) < beam_size:
        return False
    if early_stopping is True or best_live is None:
        return True
    worst = sorted((h.score for h in done), reverse=True)[beam_size - 1]
    return not normalized_score(best_live, length, length_penalty) > worst


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
    first (one for greedy and sampling, up to n_best for beam), with the token rules of the
    options (runtime/rules.py). Unset options take edgeseq's defaults (`Generator` fills a
    bundle's first). `rngs`: one per row for sampling (default: seeded by options.seed and
    the row index)."""
    options = options.filled()
    model = with_rules(model, options, step_budget(model, options.max_new_tokens))
    if options.method == "beam":
        return beam_search(
            model,
            src_ids,
            options.beam_size,
            options.max_new_tokens,
            options.length_penalty,
            options.n_best,
            options.early_stopping,
        )
    if options.method == "sample":
        rngs = rngs if rngs is not None else row_rngs(options, range(src_ids.shape[0]))
        choose = sampling_chooser(options, rngs)
    else:
        choose = choose_argmax
    hyps = token_search(model, src_ids, options.max_new_tokens, choose, options.length_penalty)
    return [[h] for h in hyps]
