"""Task metrics of generated outputs against references, torch-free.

    task_scores(hyps, refs, "g2p")     # exact_match, cer, wer, per (+ stressless wer/per)
    task_scores(hyps, refs, "tsv")     # exact_match, cer, wer, bleu, chrf (sacrebleu)

Every item has one hypothesis and one or more references. Every task gets:

- ``exact_match``: fraction of items equal to one of their references;
- ``cer``: character edit distance to the closest reference over its length;
- ``wer``: for g2p the fraction of words whose pronunciation matches no reference (the G2P
  convention); for other tasks the edit distance over whitespace-separated words.

g2p adds ``per`` (phoneme edit distance over reference phonemes) and the stressless rates;
text tasks (anything but g2p and the synthetic char tasks) add corpus ``bleu`` and ``chrf``
from sacrebleu (the `eval` extra), with every reference of an item (shorter lists padded
with their first reference, which leaves both scores unchanged).
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import MissingDependencyError
from .metrics import exact_match, score, token_error_rate

SYNTHETIC_TASKS = ("reverse", "sort", "copy")
EVAL_EXTRA_HINT = "install the eval extra: pip install 'edgeseq[eval]'"


def is_text_task(task: str | None) -> bool:
    """True for tasks scored with BLEU and chrF (sentences, not words or symbol strings)."""
    return task not in ("g2p", *SYNTHETIC_TASKS)


def sacrebleu_scores(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> dict[str, float]:
    """Corpus BLEU and chrF (sacrebleu's defaults, 0-100) of `hyps` against `refs`."""
    try:
        import sacrebleu
    except ImportError:
        raise MissingDependencyError(f"BLEU and chrF need sacrebleu: {EVAL_EXTRA_HINT}") from None
    width = max((len(options) for options in refs), default=1)
    streams = [[options[k] if k < len(options) else options[0] for options in refs]
               for k in range(width)]  # fmt: skip
    return {
        "bleu": sacrebleu.corpus_bleu(list(hyps), streams).score,
        "chrf": sacrebleu.corpus_chrf(list(hyps), streams).score,
    }


def task_scores(
    hyps: Sequence[str], refs: Sequence[Sequence[str]], task: str | None
) -> dict[str, float]:
    """The metrics of `task` (see the module docstring) for `hyps` against `refs`."""
    out = {
        "count": float(len(hyps)),
        "exact_match": exact_match(hyps, refs),
        "cer": token_error_rate(hyps, refs, tokenize=list),
    }
    if task == "g2p":
        g2p = score(hyps, refs, with_stressless=True)
        out.update({k: v for k, v in g2p.items() if k not in out})
        return out
    out["wer"] = token_error_rate(hyps, refs, tokenize=str.split)
    if is_text_task(task):
        out.update(sacrebleu_scores(hyps, refs))
    return out
