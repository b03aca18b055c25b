"""The browser tokenizer (runtime/web/tokenizer.mjs, unigram.mjs, bpe.mjs) on the tokenizer
files of each Hugging Face family's bundle as `edgeseq export` writes them: mBART-50's and
T5's Unigram (SentencePiece's Precompiled normaliser, Metaspace, the language codes or
sentinels as added tokens), NLLB's SentencePiece BPE and BART's byte-level BPE. Every file
must give the Python runtime's ids (runtime/tokenizer.py, which the import tests check
against transformers' tokenizers) on 2,400 generated texts with each family's own codes and
special tokens inserted, and its text for random id sequences. Uses the session's exported
family fixtures (conftest.py); needs Node.js; a few seconds per family once they exist.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_web_tokenizer import NODE, run_js

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
pytest.importorskip("sentencepiece", reason="needs the hf extra: pip install 'edgeseq[hf]'")
pytest.importorskip("transformers", reason="needs the hf extra: pip install 'edgeseq[hf]'")

from test_web_unigram import N_RANDOM_IDS, generated_texts, mismatches  # noqa: E402

from edgeseq.runtime.tokenizer import Tokenizer  # noqa: E402

FAMILIES = ("mbart50_import", "t5_import", "m2m_import", "bart_import")
N_TEXTS = 2400


def bundle_files(bundle: Path) -> list[Path]:
    """The bundle's tokenizer files (one when both sides share it), from config.json."""
    config = json.loads((bundle / "config.json").read_text(encoding="utf-8"))
    names = config.get("tokenizers") or {}
    return [bundle / n for n in dict.fromkeys(names.get(s, "tokenizer.json") for s in names)]


def family_texts(tokenizer: Tokenizer, seed: int) -> list[str]:
    """generated_texts with the tokenizer's own added tokens (language codes, sentinels,
    `<mask>`, specials) inserted at the start, middle or end of one text in three."""
    rng = random.Random(seed)
    words = added_tokens(tokenizer) or ["<unk>"]
    out = []
    for text in generated_texts(N_TEXTS, seed):
        if rng.random() < 1 / 3:
            word, cut = rng.choice(words), rng.randint(0, len(text))
            text = f"{text[:cut]}{rng.choice(['', ' '])}{word}{rng.choice(['', ' '])}{text[cut:]}"
        out.append(text)
    return out


def added_tokens(tokenizer: Tokenizer) -> list[str]:
    """The contents of the tokenizer's added tokens (specials, language codes, sentinels)."""
    return [a.content for a in tokenizer.hf.get_added_tokens_decoder().values()]


@pytest.mark.parametrize("family", FAMILIES)
def test_bundle_tokenizers_equal_python(family: str, request: pytest.FixtureRequest) -> None:
    bundle = request.getfixturevalue(family)["bundle"]
    files = bundle_files(bundle)
    assert files, "config.json names no tokenizer"
    python = {f: Tokenizer.load(f) for f in files}
    texts = {f: family_texts(python[f], seed=i) for i, f in enumerate(files)}
    want = {f: [python[f].encode(t) for t in texts[f]] for f in files}
    rng = random.Random(5)
    ids = {
        f: want[f] + [
            [rng.randrange(python[f].vocab_size) for _ in range(rng.randint(0, 12))]
            for _ in range(N_RANDOM_IDS)
        ]
        for f in files
    }  # fmt: skip
    got = run_js({f: {"encode": texts[f], "decode": ids[f]} for f in files})
    report = {}
    for f in files:
        assert "error" not in got[f], got[f]
        wrong_ids = mismatches(want[f], got[f]["ids"], texts[f])
        want_text = [python[f].decode(i) for i in ids[f]]
        wrong_text = mismatches(want_text, got[f]["decoded"], ids[f])
        report[f.name] = (
            len(texts[f]),
            len(wrong_ids),
            len(wrong_text),
            wrong_ids[:3],
            wrong_text[:3],
        )
    assert all(r[1] == r[2] == 0 for r in report.values()), report
    first = files[0]
    added = added_tokens(python[first])
    assert sum(any(a in t for a in added) for t in texts[first]) >= 500  # they are exercised
