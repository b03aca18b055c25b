"""Figures that several pages state: every page must state the same one.

A measured quantity (the int8 bundle's size on the opus-mt-sized Marian, a ratio to
CTranslate2, ...) belongs to the page with the command behind it (compare.md for speed and
memory against other engines); a page that repeats it must repeat it exactly. Each FACT names
the quantity and, per page that states it, a pattern whose group is the figure, matched
against the page's text with line breaks and repeated spaces made single spaces. The test
fails when a page no longer states the quantity where its pattern says (update the pattern or
drop the page) or when two pages state different figures. History is exempt: the
experiments pages keep earlier measurements on purpose, and are listed only where they hold
the current figure.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FACTS: dict[str, dict[str, str]] = {
    "the opus-mt-sized Marian's fp32 bundle, MB": {
        "docs/variants.md": r"float32: (\d+) MB for an opus-mt-sized Marian",
        "docs/import.md": r"no torch; (\d+) MB fp32",
        "docs/serve-translation.md": r"The bundle: fp32 (\d+) MB",
    },
    "its int8 bundle, MB": {
        "docs/variants.md": r"\((\d+) MB on that Marian\)",
        "docs/import.md": r"MB fp32, (\d+) MB int8",
        "docs/serve-translation.md": r"int8 (\d+) MB, `inplace`",
        "docs/experiments-marian.md": r"bundle grows from \d+ to (\d+) MB",
    },
    "its inplace decoder, fp32 MB": {
        "docs/variants.md": r"\+(\d+) MB fp32, \+\d+ MB int8 on that Marian",
        "docs/serve-translation.md": r"`inplace` \+(\d+) MB \(fp32\)",
    },
    "its peak memory above the import, fp32, beam 4 batch 32, MB": {
        "docs/compare.md": (  # the memory table: its CTranslate2 rows come after edgeseq's
            r"\| edgeseq fp32 \| [\d,]+ \| [\d,]+ \| [\d,]+ \| ([\d,]+) \|\s*"
            r"\| edgeseq int8(?: \| [\d,]+){4} \|\s*\| CTranslate2 fp32"
        ),
        "docs/serve-translation.md": r"peak memory ([\d,]+) MB \(fp32\)",
        "docs/variants.md": r"peak memory ([\d,]+) MB there",
    },
    "its export with parity checks and int8 gate, s": {
        "docs/compare.md": r"`edgeseq export` with parity and gate ([\d,]+) s",
        "docs/serve-translation.md": r"int8 gate took ([\d,]+) s",
    },
    "edgeseq fp32 / CTranslate2 fp32 on it, beam 4 batch 32": {
        "docs/compare.md": r"\*edgeseq fp32 / CTranslate2 fp32\*(?: \| [^|]*){3} \| \*\*([\d.]+)×",
        "README.md": r"beam 4 at batch 32 \(([\d.]+)× CTranslate2\)",
    },
    "edgeseq int8 / CTranslate2 int8 on it, greedy and beam 4 at batch 32": {
        "docs/compare.md": (
            r"\*edgeseq int8 / CTranslate2 int8\* \| [^|]* \| \*\*([\d.]+)×[^|]* \| [^|]* \| "
            r"\*\*([\d.]+)×"
        ),
        "README.md": r"([\d.]+)× / ([\d.]+)× at batch 32",
    },
    "g2p-en's 7 + 7 layers against 6 + 6, words/s at batch 1": {
        "models/g2p-en/README.md": r"this 7 \+ 7 model decodes ([\d.]+)× as many",
        "docs/experiments.md": r"the 6 \+ 6 one 73 \(([\d.]+)×\)",
    },
}


def flat(text: str) -> str:
    return " ".join(text.split())


def disagreements(facts: dict[str, dict[str, str]], read) -> list[str]:
    """One message per fact that a page no longer states where its pattern says, or that two
    pages state with different figures; `read(page)` gives a page's text."""
    problems = []
    for fact, patterns in facts.items():
        stated: dict[str, set[tuple[str, ...]]] = {}
        for page, pattern in patterns.items():
            found = re.findall(pattern, flat(read(page)))
            if not found:
                problems.append(f"{fact}: {page} no longer matches {pattern!r}")
            stated[page] = {m if isinstance(m, tuple) else (m,) for m in found}
        if len(set().union(*stated.values())) > 1:
            problems.append(f"{fact}: {stated}")
    return problems


def test_the_check_finds_a_page_that_disagrees_or_lost_the_figure() -> None:
    """A guard for the test below: a checker that finds nothing would pass it."""
    pages = {"a.md": "int8:\n195 MB here", "b.md": "int8: 178 MB", "c.md": "nothing"}
    facts = {"size": {"a.md": r"int8: (\d+) MB", "b.md": r"int8: (\d+) MB"}}
    assert disagreements(facts, pages.__getitem__) == [
        "size: {'a.md': {('195',)}, 'b.md': {('178',)}}"
    ]
    facts["size"]["c.md"] = r"int8: (\d+) MB"
    assert "size: c.md no longer matches" in disagreements(facts, pages.__getitem__)[0]
    assert disagreements({"size": {"a.md": r"int8: (\d+) MB"}}, pages.__getitem__) == []


@pytest.mark.parametrize("fact", sorted(FACTS))
def test_pages_state_one_figure_per_fact(fact: str) -> None:
    read = lambda page: (ROOT / page).read_text(encoding="utf-8")  # noqa: E731
    assert disagreements({fact: FACTS[fact]}, read) == []
