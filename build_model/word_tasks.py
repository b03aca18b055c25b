"""Tasks for the GPT and BERT architectures, made offline from the CMU dictionary like g2p.

    task = load_task("words")     # GPT: ("photo", "photograph"): continue a prefix into a word
    task = load_task("stress")    # BERT: ("photograph", "1"): the syllable with primary stress

`words` pairs each [a-z] word of 3+ letters with its first half (rounded up) as the prompt; a
GPT is trained on the whole word (`<s> photograph </s>`; the prompt only serves evaluation:
dev exact match = the greedy continuation of a held-out prefix is a held-out word with that
prefix). `stress` labels each word (first pronunciation) with the 1-based index of the vowel
carrying primary stress (`1`), capped at `5` ("5 or later"); a BERT classifies the spelling.
Both split by a hash of the source, like g2p (tasks.split_pairs).
"""

from __future__ import annotations

import re

from .tasks import Pair, Task, read_cmudict, split_pairs

WORD = re.compile(r"^[a-z]{3,}$")
MAX_STRESS_LABEL = 5


def _first_pronunciations() -> dict[str, str]:
    """Word -> its first pronunciation (with stress digits), in dictionary order."""
    out: dict[str, str] = {}
    for word, phonemes in read_cmudict(stress=True):
        out.setdefault(word, phonemes)
    return out


def words_task() -> Task:
    """(first half of the word, word) for every [a-z]{3,} CMU word; one char vocabulary."""
    pairs: list[Pair] = [
        (word[: (len(word) + 1) // 2], word) for word in _first_pronunciations() if WORD.match(word)
    ]
    return Task(
        "words", {}, **split_pairs(pairs), source_kind="char", target_kind="char", shared_vocab=True
    )


def stress_label(phonemes: str) -> str | None:
    """ "1".."5": the position of the primary-stressed vowel among the vowels of `phonemes`
    ("F OW1 T AH0 G R AE2 F" -> "1"), 5 for the fifth or later; None without a `1`."""
    vowels = [p for p in phonemes.split() if p[-1].isdigit()]
    for index, vowel in enumerate(vowels, start=1):
        if vowel.endswith("1"):
            return str(min(index, MAX_STRESS_LABEL))
    return None


def stress_task() -> Task:
    """(word, stress label) for every [a-z]{3,} CMU word with a primary stress."""
    pairs: list[Pair] = []
    for word, phonemes in _first_pronunciations().items():
        label = stress_label(phonemes)
        if WORD.match(word) and label is not None:
            pairs.append((word, label))
    return Task("stress", {}, **split_pairs(pairs), source_kind="char", target_kind="word")


WORD_TASKS = {"words": words_task, "stress": stress_task}
# The architecture each task trains (a recipe must choose it).
TASK_ARCHITECTURE = {"words": "decoder-only", "stress": "encoder-only"}
