"""Tokenizers: round trips for every kind, special ids, and files plain `tokenizers` can read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer

from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.errors import TokenizerError
from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

WORDS = ["hello", "world", "o'neil", "abc xyz"]
PHONEMES = ["HH AH0 L OW1", "W ER1 L D", "OW0 N IY1 L"]
SENTENCES = ["the cat sat on the mat", "a dog sat on a log", "the dog ate the cat food"] * 5


@pytest.mark.parametrize(
    ("kind", "texts"), [("char", WORDS), ("word", PHONEMES), ("bpe", SENTENCES)]
)
def test_round_trip_and_plain_tokenizers_file(kind: str, texts: list[str], tmp_path: Path) -> None:
    tok = Tokenizer.train(kind, texts, vocab_size=60)
    assert tok.kind == kind
    for want_id, token in enumerate(SPECIAL_TOKENS):
        assert tok.id_to_token(want_id) == token
    for text in texts:
        ids = tok.encode(text)
        assert ids and min(ids) >= len(SPECIAL_TOKENS)
        assert tok.decode(ids) == text
    tok.save(tmp_path / "tokenizer.json")
    plain = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    loaded = Tokenizer.load(tmp_path / "tokenizer.json")
    assert loaded.kind == kind and loaded.vocab_size == tok.vocab_size
    for text in texts:
        assert plain.encode(text, add_special_tokens=False).ids == tok.encode(text)
        assert loaded.encode(text) == tok.encode(text)


def test_char_tokens_are_characters_and_unknowns_become_unk() -> None:
    tok = Tokenizer.train_char(["abc"])
    assert tok.encode("cab") == [6, 4, 5]
    assert tok.encode("az") == [4, tok.unk_id]


def test_encode_batch_pads_and_adds_specials() -> None:
    tok = Tokenizer.train_char(["abc"])
    batch = tok.encode_batch(["ab", "c"], add_bos=True, add_eos=True)
    assert batch.dtype == np.int64
    np.testing.assert_array_equal(batch, [[1, 4, 5, 2], [1, 6, 2, 0]])
    assert tok.decode([4, 5, 2, 6]) == "ab"  # stops at </s>


def test_pair_saves_one_file_when_shared_two_otherwise(tmp_path: Path) -> None:
    src, tgt = Tokenizer.train_char(WORDS), Tokenizer.train_word(PHONEMES)
    assert TokenizerPair(src, src).save(tmp_path) == ["tokenizer.json"]
    assert TokenizerPair.load(tmp_path).shared
    both = tmp_path / "both"
    both.mkdir()
    assert TokenizerPair(src, tgt).save(both) == ["tokenizer.json", "tokenizer.target.json"]
    loaded = TokenizerPair.load(both)
    assert not loaded.shared
    assert loaded.target.encode(PHONEMES[0]) == tgt.encode(PHONEMES[0])


def test_missing_or_bad_file_raises_tokenizer_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        Tokenizer.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot read tokenizer"):
        Tokenizer.load(tmp_path / "bad.json")
