"""Tasks: deterministic disjoint splits, g2p filtering and stress, synthetic data, tsv errors."""

from __future__ import annotations

import hashlib
import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from edgeseq.build_model.tasks import encode_pairs, load_task, make_batches, split_of
from edgeseq.runtime.errors import DataError


@pytest.fixture(scope="module")
def g2p():
    return load_task("g2p")


def test_g2p_split_is_deterministic_disjoint_and_hash_based(g2p) -> None:
    words = {name: {w for w, _ in g2p.split(name)} for name in ("train", "dev", "test")}
    assert not words["train"] & words["dev"]
    assert not words["train"] & words["test"]
    assert not words["dev"] & words["test"]
    for name, low, high in (("test", 0, 5), ("dev", 5, 10), ("train", 10, 100)):
        for word in list(words[name])[:300]:
            bucket = int(hashlib.sha256(word.encode()).hexdigest(), 16) % 100
            assert low <= bucket < high
    total = sum(len(w) for w in words.values())
    assert 0.04 < len(words["test"]) / total < 0.06
    assert load_task("g2p").dev == g2p.dev  # same order too


def test_g2p_keeps_lowercase_words_and_every_pronunciation(g2p) -> None:
    assert all(re.fullmatch(r"[a-z']+", w) for w, _ in g2p.train[::50])
    sources = {w for w, _ in g2p.train} | {w for w, _ in g2p.dev} | {w for w, _ in g2p.test}
    assert "ad-hoc" not in sources and "a." not in sources and "'bout" in sources
    split = g2p.split(split_of("read"))
    assert sorted(p for w, p in split if w == "read") == ["R EH1 D", "R IY1 D"]
    refs = g2p.references(split_of("read")) if split_of("read") != "train" else None
    if refs is not None:
        assert sorted(refs["read"]) == ["R EH1 D", "R IY1 D"]
    multi = [w for w, options in g2p.references("dev").items() if len(options) > 1]
    assert len(multi) > 100
    assert g2p.has_stress and g2p.describe() == {"name": "g2p", "options": {"stress": True}}


def test_g2p_without_stress_strips_digits() -> None:
    task = load_task("g2p", stress=False)
    assert not any(re.search(r"\d", p) for _, p in task.train)
    assert not task.has_stress
    tokenizers = task.build_tokenizers()
    assert tokenizers.target.vocab_size == 39 + 4  # ARPAbet phonemes + specials
    assert tokenizers.source.kind == "char" and tokenizers.target.kind == "word"


@pytest.mark.parametrize(
    ("name", "expect"), [("reverse", lambda s: s[::-1]), ("sort", sorted), ("copy", str)]
)
def test_synthetic_tasks_are_seeded_and_correct(name: str, expect) -> None:
    task = load_task(name, size=500)
    for source, target in task.train + task.dev + task.test:
        assert target == "".join(expect(source))
        assert 1 <= len(source) <= 12 and set(source) <= set("abcdefghij")
    assert load_task(name, size=500).train == task.train
    assert load_task(name, size=500, seed=1).train != task.train
    sources = [{s for s, _ in task.split(n)} for n in ("train", "dev", "test")]
    assert sum(len(s) for s in sources) == len(set().union(*sources)) == 500
    tokenizers = task.build_tokenizers()
    assert tokenizers.shared and tokenizers.source.kind == "char"


def test_task_rebuilds_from_its_description() -> None:
    task = load_task("sort", size=150, alphabet="xyz", max_len=5)
    again = load_task(task.name, **task.describe()["options"])
    assert again.train == task.train and again.describe() == task.describe()


def test_tsv_task_reads_pairs_and_hash_splits(tmp_path: Path) -> None:
    corpus = tmp_path / "pairs.tsv"
    corpus.write_text("".join(f"w{i}\tW {i}\n" for i in range(200)) + "\n")
    task = load_task("tsv", path=str(corpus), kind="char", target_kind="word")
    assert len(task.train) + len(task.dev) + len(task.test) == 200
    assert all(split_of(s) == "dev" for s, _ in task.dev)
    assert task.target_kind == "word" and not task.target_tokens_are_chars
    assert load_task(task.name, **task.describe()["options"]).dev == task.dev


def test_tsv_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.tsv"
    corpus.write_text("a\tA\nb\tB\nno tab here\nc\tC\n")
    with pytest.raises(DataError, match=r"bad\.tsv:3: expected 'source<TAB>target'"):
        load_task("tsv", path=str(corpus))
    corpus.write_text("a\tA\n\t\n")
    with pytest.raises(DataError, match=r"bad\.tsv:2"):
        load_task("tsv", path=str(corpus))
    with pytest.raises(DataError, match="does not exist"):
        load_task("tsv", path=str(tmp_path / "missing.tsv"))


def test_unknown_task_or_option_raises_data_error() -> None:
    with pytest.raises(DataError, match="size 200 is more than half of the 363 possible"):
        load_task("copy", size=200, alphabet="xyz", max_len=5)
    with pytest.raises(DataError, match="unknown task 'p2g'; choose one of g2p"):
        load_task("p2g")
    with pytest.raises(DataError, match="bad options for task 'g2p'"):
        load_task("g2p", stres=False)
    with pytest.raises(DataError, match="unknown tokenizer kind 'chars'"):
        load_task("tsv", path="x.tsv", kind="chars")


def test_batches_cover_every_example_once_within_the_token_budget() -> None:
    rng = np.random.default_rng(0)
    lengths = [(int(a), int(b)) for a, b in rng.integers(2, 30, size=(500, 2))]
    for noise in (0.0, 0.7):
        batches = make_batches(lengths, 300, np.random.default_rng(1), noise)
        assert sorted(np.concatenate(batches).tolist()) == list(range(500))
        for rows in batches:
            width = max(lengths[i][0] for i in rows) + max(lengths[i][1] for i in rows)
            assert len(rows) * width <= 300
        again = make_batches(lengths, 300, np.random.default_rng(1), noise)
        assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    # without noise, batches cover disjoint length ranges; with noise they overlap
    for noise, disjoint in ((0.0, True), (0.7, False)):
        spans = sorted(
            (min(lengths[i][0] + lengths[i][1] for i in rows),
             max(lengths[i][0] + lengths[i][1] for i in rows))
            for rows in make_batches(lengths, 300, np.random.default_rng(2), noise)
        )  # fmt: skip
        overlaps = any(hi > lo for (_, hi), (lo, _) in itertools.pairwise(spans))
        assert overlaps != disjoint


def test_encode_pairs_drops_pairs_longer_than_max_len() -> None:
    task = load_task("copy", size=200)
    tokenizers = task.build_tokenizers()
    kept, dropped = encode_pairs(task.train, tokenizers, max_len=8)  # 7 tokens + </s>
    assert dropped == sum(len(s) > 7 for s, _ in task.train) > 0
    assert all(len(s) <= 7 for s, _ in kept)
