"""Test-only references that guard the search itself (issue 4).

- `FakeStep`: a small numpy StepModel with a real dependence on the whole prefix, which
  records the batch size of every step (to see finished rows leave the batch).
- `naive_greedy` / `naive_beam`: one input at a time, no cache, no batching, no `select`:
  every step re-decodes the whole prefix from past_len 0 (`full_prefix_logprobs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

NextLogprobs = Callable[[tuple[int, ...]], np.ndarray]  # generated prefix -> (V,) float64


@dataclass
class FakeState:
    """src_vec (B, D) summary of the source; history (B, P) of fed target ids."""

    src_vec: np.ndarray
    src_len: np.ndarray
    history: np.ndarray

    @property
    def batch(self) -> int:
        return int(self.src_vec.shape[0])

    @property
    def past_len(self) -> int:
        return int(self.history.shape[1])


class FakeStep:
    """logits(t) = tanh(src + sum_i decay^(t-i) E[y_i] + P[t]) W, with `</s>` growing likely
    once the output is as long as the source; `<pad>`, `<s>`, `<unk>` are never likely."""

    def __init__(self, vocab_size: int = 9, src_vocab: int = 9, max_len: int = 12, seed: int = 0):
        rng = np.random.default_rng(seed)
        d = 16
        self.max_len, self.vocab_size = max_len, vocab_size
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.src_embed = rng.normal(size=(src_vocab, d))
        self.tgt_embed = rng.normal(size=(vocab_size, d))
        self.positions = rng.normal(size=(max_len, d)) * 0.5
        self.out = rng.normal(size=(d, vocab_size)) * 1.5
        self.batch_sizes: list[int] = []

    def start(self, src_ids: np.ndarray) -> FakeState:
        keep = src_ids != self.pad_id  # (B, S)
        vec = (self.src_embed[src_ids] * keep[..., None]).sum(1) / keep.sum(1, keepdims=True)
        empty = np.zeros((src_ids.shape[0], 0), dtype=np.int64)
        return FakeState(vec, keep.sum(1), empty)

    def step(self, state: FakeState, input_ids: np.ndarray) -> tuple[np.ndarray, FakeState]:
        self.batch_sizes.append(int(input_ids.shape[0]))
        history = np.concatenate([state.history, input_ids], axis=1)  # (B, P+N)
        logits = []
        for pos in range(state.past_len, history.shape[1]):
            weights = 0.6 ** (pos - np.arange(pos + 1))  # (pos+1,)
            h = state.src_vec + (self.tgt_embed[history[:, : pos + 1]] * weights[:, None]).sum(1)
            z = np.tanh(h + self.positions[pos]) @ self.out  # (B, V)
            z[:, [self.pad_id, self.bos_id, 3]] -= 30.0
            z[:, self.eos_id] += 3.0 * (pos - state.src_len)
            logits.append(z)
        return np.stack(logits, axis=1).astype(np.float32), FakeState(
            state.src_vec, state.src_len, history
        )

    def select(self, state: FakeState, rows: np.ndarray) -> FakeState:
        return FakeState(state.src_vec[rows], state.src_len[rows], state.history[rows])


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def full_prefix_logprobs(step_model, src_row: Sequence[int], bos_id: int) -> NextLogprobs:
    """Next-token log-probabilities by re-decoding <s> + prefix from an empty cache."""
    src = np.asarray([list(src_row)], dtype=np.int64)

    def next_logprobs(prefix: tuple[int, ...]) -> np.ndarray:
        state = step_model.start(src)
        logits, _ = step_model.step(state, np.asarray([[bos_id, *prefix]], dtype=np.int64))
        return log_softmax(logits[0, -1])

    return next_logprobs


def torch_logprobs(model, src_row: Sequence[int]) -> NextLogprobs:
    """Next-token log-probabilities from the model's teacher-forced forward (no step API)."""
    import torch

    src = torch.as_tensor([list(src_row)], dtype=torch.int64)

    def next_logprobs(prefix: tuple[int, ...]) -> np.ndarray:
        tgt = torch.as_tensor([[model.cfg.bos_id, *prefix]], dtype=torch.int64)
        with torch.inference_mode():
            logits = model(src, tgt)
        return log_softmax(logits[0, -1].double().numpy())

    return next_logprobs


def naive_greedy(next_logprobs: NextLogprobs, eos_id: int, steps: int) -> tuple[list[int], float]:
    """(tokens without </s>, summed logprob) by arg-max over full re-decodes."""
    tokens: list[int] = []
    total = 0.0
    for _ in range(steps):
        logp = next_logprobs(tuple(tokens))
        token = int(np.argmax(logp))
        total += logp[token]
        if token == eos_id:
            break
        tokens.append(token)
    return tokens, total


def naive_beam(
    next_logprobs: NextLogprobs,
    eos_id: int,
    beam: int,
    steps: int,
    length_penalty: float = 1.0,
) -> list[tuple[tuple[int, ...], float, float, bool]]:
    """Every hypothesis (tokens, logprob, score, finished), best first, for one input."""
    beams: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    finished: list[tuple[tuple[int, ...], float, bool]] = []
    for _ in range(steps):
        candidates = []
        for tokens, lp in beams:
            logp = next_logprobs(tokens)
            candidates += [(lp + logp[v], tokens, v) for v in range(len(logp))]
        ranked = sorted(candidates, key=lambda c: -c[0])  # stable: ties by beam, then token
        survivors = []
        for rank, (total, tokens, v) in enumerate(ranked[: 2 * beam]):
            if v == eos_id:
                if rank < beam:
                    finished.append((tokens, total, True))
                continue
            survivors.append(((*tokens, v), total))
            if len(survivors) == beam:
                break
        beams = survivors
        if len(finished) >= beam or not beams:
            beams = []
            break
    finished += [(tokens, lp, False) for tokens, lp in beams]

    def score(tokens: tuple[int, ...], lp: float, done: bool) -> float:
        return lp / max(len(tokens) + done, 1) ** length_penalty

    scored = [(t, lp, score(t, lp, done), done) for t, lp, done in finished]
    return sorted(scored, key=lambda h: -h[2])
