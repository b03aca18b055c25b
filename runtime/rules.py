"""Token rules: bans and forced tokens applied to each step's log-probabilities, as
transformers' logits processors apply a checkpoint's generation settings, for any
`StepModel` and any search (greedy, beam, sampling).

    model = with_rules(step_model, options, budget)    # step_model itself when no rule applies
    hyps = beam_search(model, src_ids, 4)              # the rules hold in every hypothesis

A `Constrained` model's `step` returns float64 log-probabilities (`gives_logprobs`): the
log-softmax of the wrapped model's logits, then at the last position, in this order:

- `no_repeat_ngram_size` n: a token that would repeat an n-gram of the row's tokens so far
  (`<s>` included, as transformers counts the decoder start) gets -inf;
- `bad_words_ids`: a one-token entry is always -inf; a longer one bans its last token when
  the row's tokens end with the others;
- `min_new_tokens` m: `</s>` is -inf while fewer than m tokens were generated;
- `forced_eos`: at the last step of the length budget every token but `</s>` is -inf and
  `</s>` gets 0 (transformers' forced_eos_token_id at max_length - 1);
- `renormalize`: a second log-softmax, so that the banned tokens' probability goes to the
  others (transformers' renormalize_logits). Without it the others keep their
  log-probabilities, which is what beam search adds up, as transformers does.

A forced target prefix (runtime/prefix.py) stays outermost: `with_rules` puts the rules
under it, so a forced token is never banned (transformers forces after its bans).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .options import GenerationOptions
from .prefix import ForcedPrefix
from .step import StepModel, WrappedState, max_positions


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis in float64: (..., V) -> (..., V)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z


@dataclass(frozen=True)
class RulesState(WrappedState):
    """The wrapped model's state and each row's tokens fed so far int64 (B, T), `<s>` first."""

    history: np.ndarray


class Constrained:
    """A `StepModel` applying the token rules of `options` (see the module docstring);
    `budget` is the search's step budget (the step `forced_eos` forces `</s>` at)."""

    gives_logprobs = True  # `step` returns log-probabilities: the search takes them as they are
    top_width = 0  # the rules read every token's value: never the graph's top-k outputs

    def __init__(self, model: StepModel, options: GenerationOptions, budget: int) -> None:
        self.model = model
        self.max_len, self.vocab_size = model.max_len, model.vocab_size
        self.max_positions = max_positions(model)
        self.bos_id, self.eos_id, self.pad_id = model.bos_id, model.eos_id, model.pad_id
        self.ngram = options.no_repeat_ngram_size or 0
        self.min_new = options.min_new_tokens or 0
        words = options.bad_words_ids or ()
        self.banned = np.array(sorted({w[0] for w in words if len(w) == 1}), dtype=np.int64)
        self.sequences = [w for w in words if len(w) > 1]
        self.forced_eos_step = budget - 1 if options.forced_eos else None
        self.renormalize = bool(options.renormalize)

    def start(self, src_ids: np.ndarray) -> RulesState:
        """Encode `src_ids` int64 (B, S); no token fed yet."""
        inner = self.model.start(src_ids)
        return RulesState(inner, np.zeros((len(src_ids), 0), dtype=np.int64))

    def step(self, state: RulesState, input_ids: np.ndarray) -> tuple[np.ndarray, RulesState]:
        """input_ids int64 (B, N) -> log-probabilities float64 (B, N, V), the rules applied
        at the last position, and the state."""
        logits, inner = self.model.step(state.inner, input_ids)
        history = np.concatenate([state.history, np.asarray(input_ids, dtype=np.int64)], axis=1)
        out = log_softmax(logits)
        out[:, -1] = self.apply(out[:, -1], history)
        return out, RulesState(inner, history)

    def apply(self, logprobs: np.ndarray, history: np.ndarray) -> np.ndarray:
        """The rules on the next token's log-probabilities (B, V) after the rows' tokens
        `history` int64 (B, T) (`<s>` first)."""
        generated = history.shape[1] - 1  # tokens generated before the next one
        if self.ngram or self.sequences:  # bans that depend on each row's tokens
            for row, tokens in enumerate(history.tolist()):
                logprobs[row, self._row_bans(tokens)] = -np.inf
        if len(self.banned):
            logprobs[:, self.banned] = -np.inf
        if generated < self.min_new:
            logprobs[:, self.eos_id] = -np.inf
        if generated == self.forced_eos_step:
            logprobs[:] = -np.inf
            logprobs[:, self.eos_id] = 0.0
        return log_softmax(logprobs) if self.renormalize else logprobs

    def _row_bans(self, tokens: list[int]) -> list[int]:
        """The ids one row may not take next: n-gram repeats and bad-word endings."""
        bans = []
        n = self.ngram
        if n and len(tokens) + 1 >= n:
            tail = tuple(tokens[len(tokens) - n + 1 :]) if n > 1 else ()
            for i in range(len(tokens) - n + 1):
                if tuple(tokens[i : i + n - 1]) == tail:
                    bans.append(tokens[i + n - 1])
        for word in self.sequences:
            start = len(tokens) - len(word) + 1
            if start >= 0 and tuple(tokens[start:]) == word[:-1]:
                bans.append(word[-1])
        return bans

    def select(self, state: RulesState, rows: np.ndarray) -> RulesState:
        """The rows `rows` of the state, with their tokens."""
        idx = np.asarray(rows, dtype=np.int64)
        return RulesState(self.model.select(state.inner, idx), state.history[idx])


def with_rules(model: StepModel, options: GenerationOptions, budget: int) -> StepModel:
    """`model` applying the token rules of `options` (under its forced prefix, if any), or
    `model` itself when none applies or it applies them already."""
    if not options.has_rules:
        return model
    inner = model.model if isinstance(model, ForcedPrefix) else model
    if isinstance(inner, Constrained):
        return model
    constrained = Constrained(inner, options, budget)
    if isinstance(model, ForcedPrefix):
        return ForcedPrefix(constrained, model.prefixes)  # type: ignore[return-value]
    return constrained  # type: ignore[return-value]
