"""Sequence metrics for G2P and other seq2seq tasks; Python and numpy, no torch.

Every item has one hypothesis and one or more references (a word may have several
pronunciations); an item counts as correct when the hypothesis equals any reference.

    edit_distance(["K", "AE1", "T"], ["K", "AA1", "T"])          # 1
    word_error_rate(["K AE1 T"], [["K AA1 T", "K AE1 T"]])       # 0.0
    token_error_rate(["K AE1 T"], [["K AA1 T S"]])                # 2 / 4 = 0.5
    strip_stress("HH AH0 L OW1")                                 # "HH AH L OW"
    score(hyps, refs)  # {"count": ..., "exact_match": ..., "wer": ..., "per": ...}
    evaluate_references(step_model, tokenizers, task.references("test"))  # same, by decoding

`evaluate_references` scores any engine behind the step interface (PyTorch or onnxruntime).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from .padding import right_pad
from .search import greedy_search
from .step import StepModel
from .tokenizer import TokenizerPair

_DIGITS = re.compile(r"\d")

Tokenize = Callable[[str], Sequence[Hashable]]


try:  # ~11-16x faster than the Python loop below (docs/experiments.md); optional
    from rapidfuzz.distance import Levenshtein as _Levenshtein
except ImportError:  # pragma: no cover - depends on the install
    _Levenshtein = None


def edit_distance(hyp: Sequence[Hashable], ref: Sequence[Hashable]) -> int:
    """Levenshtein distance: fewest insertions, deletions and substitutions turning hyp into ref.
    Computed by rapidfuzz when it is installed (the `eval` extra), else `python_edit_distance`;
    both give the same numbers."""
    if _Levenshtein is not None:
        return _Levenshtein.distance(hyp, ref)
    return python_edit_distance(hyp, ref)


def python_edit_distance(hyp: Sequence[Hashable], ref: Sequence[Hashable]) -> int:
    """Levenshtein distance by dynamic programming over two rows, in pure Python."""
    previous = list(range(len(ref) + 1))  # distances from hyp[:0] to every ref prefix
    for i, h in enumerate(hyp, start=1):
        current = [i]
        for j, r in enumerate(ref, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (h != r)))
        previous = current
    return previous[-1]


def _check(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} reference lists")
    for i, options in enumerate(refs):
        if isinstance(options, str) or len(options) == 0:
            raise ValueError(f"item {i}: references must be a non-empty list of strings")


def exact_match(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """Fraction of items whose hypothesis equals one of its references (0.0 for no items)."""
    _check(hyps, refs)
    if not hyps:
        return 0.0
    return sum(h in options for h, options in zip(hyps, refs, strict=True)) / len(hyps)


def word_error_rate(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """G2P word error rate: fraction of items whose hypothesis matches none of the references."""
    return 1.0 - exact_match(hyps, refs) if hyps else 0.0


def token_error_rate(
    hyps: Sequence[str], refs: Sequence[Sequence[str]], tokenize: Tokenize = str.split
) -> float:
    """Sum over items of the edit distance to the closest reference, divided by the summed
    length of those closest references (phoneme error rate for G2P). Ties in distance pick
    the first listed reference. `tokenize` splits a string into tokens (default: whitespace)."""
    _check(hyps, refs)
    errors = length = 0
    for hyp, options in zip(hyps, refs, strict=True):
        hyp_tokens = tokenize(hyp)
        best = min(
            ((edit_distance(hyp_tokens, tokenize(r)), len(tokenize(r))) for r in options),
            key=lambda pair: pair[0],
        )
        errors += best[0]
        length += best[1]
    return errors / length if length else 0.0


def strip_stress(phonemes: str) -> str:
    """Remove stress digits from ARPAbet phonemes: "HH AH0 L OW1" -> "HH AH L OW"."""
    return _DIGITS.sub("", phonemes)


def score(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    tokenize: Tokenize = str.split,
    with_stressless: bool = False,
) -> dict[str, float]:
    """Count, exact match, WER and token error rate ("per") of hypotheses against references.

    With `with_stressless`, also "wer_nostress" and "per_nostress", computed after
    `strip_stress` on hypotheses and references (for G2P with stress marks)."""
    out = {
        "count": float(len(hyps)),
        "exact_match": exact_match(hyps, refs),
        "wer": word_error_rate(hyps, refs),
        "per": token_error_rate(hyps, refs, tokenize),
    }
    if with_stressless:
        bare_hyps = [strip_stress(h) for h in hyps]
        bare_refs = [[strip_stress(r) for r in options] for options in refs]
        out["wer_nostress"] = word_error_rate(bare_hyps, bare_refs)
        out["per_nostress"] = token_error_rate(bare_hyps, bare_refs, tokenize)
    return out


# -- scoring a model ---------------------------------------------------------------------
SearchFn = Callable[[StepModel, np.ndarray, int], list[list[int]]]


def generate_texts(
    model: StepModel,
    sources: Sequence[str],
    tokenizers: TokenizerPair,
    batch_size: int = 128,
    search: SearchFn = greedy_search,
) -> list[str]:
    """Decode every source with `search` (default greedy) in length-sorted batches of
    `batch_size`; return the target texts in input order. Sources longer than the model's
    max_len are cut to fit (their last position keeps `</s>`). Every row may run to the
    model's max_len, the default budget of `Generator`, so an output that never ends is cut
    at the same length whichever path scores it (its PER does not depend on the batch)."""
    encoded = [tokenizers.source.encode(s)[: model.max_len - 1] for s in sources]
    order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))
    texts = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        src_ids = right_pad([[*encoded[i], model.eos_id] for i in rows], model.pad_id)  # (B, S)
        for i, ids in zip(rows, search(model, src_ids, model.max_len), strict=True):
            texts[i] = tokenizers.target.decode(ids)
    return texts


def evaluate_references(
    model: StepModel,
    tokenizers: TokenizerPair,
    references: dict[str, list[str]],
    limit: int | None = None,
    batch_size: int = 128,
    tokenize: Tokenize = str.split,
    with_stressless: bool = False,
    search: SearchFn = greedy_search,
) -> dict[str, float]:
    """`score` of the model's outputs for the first `limit` sources of `references`
    (source -> acceptable targets), e.g. `Task.references("test")`."""
    sources = list(references)[:limit]
    hyps = generate_texts(model, sources, tokenizers, batch_size, search)
    return score(hyps, [references[s] for s in sources], tokenize, with_stressless)
