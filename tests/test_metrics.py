"""runtime/metrics.py on hand-computed examples."""

from __future__ import annotations

import pytest

from edgeseq.runtime.metrics import (
    edit_distance,
    exact_match,
    score,
    strip_stress,
    token_error_rate,
    word_error_rate,
)


@pytest.mark.parametrize(
    ("hyp", "ref", "distance"),
    [
        ("kitten", "sitting", 3),  # 2 substitutions + 1 insertion
        ("", "abc", 3),
        ("abc", "", 3),
        ("abc", "abc", 0),
        ("ab", "ba", 2),  # no transpositions in Levenshtein
        ("flaw", "lawn", 2),
    ],
)
def test_edit_distance_of_strings(hyp: str, ref: str, distance: int) -> None:
    assert edit_distance(hyp, ref) == distance
    assert edit_distance(ref, hyp) == distance


def test_edit_distance_of_phoneme_lists() -> None:
    assert edit_distance(["K", "AE1", "T"], ["K", "AA1", "T"]) == 1
    assert edit_distance(["K", "AE1", "T"], ["K", "AE1", "T", "S"]) == 1
    assert edit_distance(["AH0"], ["AH"]) == 1  # tokens compare whole


def test_word_error_rate_accepts_any_reference() -> None:
    hyps = ["R IY1 D", "R EH1 D", "K AE1 T", "D AO1 G"]
    refs = [["R EH1 D", "R IY1 D"], ["R EH1 D", "R IY1 D"], ["K AE1 T"], ["D AA1 G"]]
    assert word_error_rate(hyps, refs) == pytest.approx(0.25)
    assert exact_match(hyps, refs) == pytest.approx(0.75)


def test_token_error_rate_uses_the_closest_reference() -> None:
    # item 1: distance 1 to "K AE1 T S" (length 4), distance 2 to "K AA1 T" -> 1 / 4
    # item 2: hyp "D AO1" vs "D AO1 G": one deletion over 3
    hyps = ["K AE1 T", "D AO1"]
    refs = [["K AA1 T Z", "K AE1 T S"], ["D AO1 G"]]
    assert token_error_rate(hyps, refs) == pytest.approx((1 + 1) / (4 + 3))
    assert token_error_rate(["abd"], [["abc"]], tokenize=list) == pytest.approx(1 / 3)


def test_strip_stress_and_stressless_scores() -> None:
    assert strip_stress("HH AH0 L OW1") == "HH AH L OW"
    assert strip_stress("AH") == "AH"
    result = score(["HH AH1 L OW1"], [["HH AH0 L OW1"]], with_stressless=True)
    assert result["wer"] == 1.0 and result["per"] == pytest.approx(0.25)
    assert result["wer_nostress"] == 0.0 and result["per_nostress"] == 0.0
    assert result["count"] == 1.0 and result["exact_match"] == 0.0


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="2 hypotheses but 1 reference"):
        word_error_rate(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="non-empty list"):
        exact_match(["a"], ["a"])  # a bare string instead of a list of references
