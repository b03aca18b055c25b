"""A source model's vocabulary renumbered so that edgeseq's special tokens come first.

    vocab = read_vocabulary(path, {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"})
    vocab.to_source[e]      # the source's id of edgeseq id e (int64 (V,))
    vocab.from_source[s]    # the edgeseq id of source id s
    vocab.tokenizer()       # a runtime Tokenizer speaking edgeseq ids

edgeseq's runtime needs `<pad>` `<s>` `</s>` `<unk>` at ids 0..3 (runtime/tokenizer.py). The
source's four special tokens take those ids and edgeseq's names; every other token keeps its
order after them. A source without `<s>` (T5: decoding starts from `<pad>`) passes
`"bos": None`: edgeseq's `<s>` is then a new id 1 that no text produces, and the vocabulary
grows by one (`to_source[1]` is -1). A vocabulary is a token list (one token per line,
id = line number) or a `tokenizers` JSON file (WordLevel, WordPiece, BPE or Unigram; its
ids are rewritten, its post-processor dropped: edgeseq adds `<s>`/`</s>` itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.tokenizer import Tokenizer

from . import SourceError

ROLES = ("pad", "bos", "eos", "unk")  # the order of SPECIAL_TOKENS: edgeseq ids 0..3
NEW_TOKEN_SCORE = -1e4  # a Unigram score below any piece's: an added `<s>` is never chosen
UNUSED = "<edgeseq unused {}>"  # ids an embedding has beyond its tokenizer's


@dataclass
class Vocabulary:
    """A source vocabulary and its renumbering (see the module docstring)."""

    path: Path
    tokens: list[str]  # the source's tokens, by source id
    specials: dict[str, int | None]  # role -> source id (None: bos, added)
    data: dict[str, Any] | None = None  # the tokenizers JSON; None for a token list
    to_source: np.ndarray = field(init=False)  # int64 (V,): source id of each edgeseq id
    from_source: np.ndarray = field(init=False)  # int64 (V,): edgeseq id of each source id

    def __post_init__(self) -> None:
        special_ids = [self.specials[role] for role in ROLES]
        others = [i for i in range(len(self.tokens)) if i not in set(special_ids)]
        self.to_source = np.array([-1 if i is None else i for i in special_ids] + others)
        self.from_source = np.zeros(len(self.tokens), dtype=np.int64)
        known = self.to_source >= 0
        self.from_source[self.to_source[known]] = np.flatnonzero(known)

    @property
    def size(self) -> int:
        """Number of edgeseq ids: the source's, plus one when `<s>` is added."""
        return len(self.to_source)

    def token(self, edgeseq_id: int) -> str:
        """The token of `edgeseq_id`, specials under edgeseq's names."""
        if edgeseq_id < len(SPECIAL_TOKENS):
            return SPECIAL_TOKENS[edgeseq_id]
        return self.tokens[int(self.to_source[edgeseq_id])]

    def tokenizer(self) -> Tokenizer:
        """A runtime Tokenizer in edgeseq ids: "word" for a token list, else the source's
        tokenizer with its ids rewritten."""
        vocab = {self.token(e): e for e in range(self.size)}
        if self.data is None:
            hf = HFTokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[3]))
            hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
            return Tokenizer(hf, "word")
        hf = HFTokenizer.from_str(json.dumps(self._renumbered_json()))
        for e in range(self.size):
            if hf.token_to_id(self.token(e)) != e:
                raise SourceError(f"{self.path}: cannot renumber token {self.token(e)!r}")
        model, decoder = self.data["model"], self.data.get("decoder") or {}
        kind = {"BPE": "bpe", "Unigram": "unigram"}.get(model["type"], "word")
        return Tokenizer(hf, "char" if kind == "word" and decoder.get("type") == "Fuse" else kind)

    def _renumbered_json(self) -> dict[str, Any]:
        """The tokenizers JSON with edgeseq ids and special token names."""
        assert self.data is not None
        data = json.loads(json.dumps(self.data))  # a deep copy
        renamed = {
            self.tokens[i]: SPECIAL_TOKENS[n]
            for n, r in enumerate(ROLES)
            if (i := self.specials[r]) is not None
        }
        model = data["model"]
        if model["type"] == "Unigram":
            pieces = model["vocab"]
            scores = [piece[1] for piece in pieces] + [0.0] * (len(self.tokens) - len(pieces))
            scores.append(NEW_TOKEN_SCORE)  # index -1: the added <s>
            model["vocab"] = [[self.token(e), scores[self.to_source[e]]] for e in range(self.size)]
            model["unk_id"] = 3
        else:
            model["vocab"] = {self.token(e): e for e in range(self.size)}
            if model.get("unk_token") in renamed:
                model["unk_token"] = renamed[model["unk_token"]]
        for added in data.get("added_tokens") or []:
            added["id"] = int(self.from_source[added["id"]])
            added["content"] = renamed.get(added["content"], added["content"])
        data["post_processor"] = None
        return data


def read_vocabulary(path: Path, special_tokens: dict[str, str | None]) -> Vocabulary:
    """Read a token list or a tokenizers JSON; `special_tokens` maps pad/bos/eos/unk to the
    source's token strings (bos None: the source has none, edgeseq adds one). Refuses a
    vocabulary lacking one or using edgeseq's names for ordinary tokens."""
    if not path.is_file():
        raise SourceError(f"vocabulary {path} does not exist")
    data = None
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ids = HFTokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise SourceError(f"cannot read tokenizer {path}: {exc}") from None
        if sorted(ids.values()) != list(range(len(ids))):
            raise SourceError(f"tokenizer {path} has gaps in its ids")
        tokens = sorted(ids, key=ids.__getitem__)
    else:
        lines = path.read_text(encoding="utf-8").split("\n")
        tokens = [line.rstrip("\r") for line in (lines[:-1] if lines[-1] == "" else lines)]
    position: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in position:
            raise SourceError(
                f"vocabulary {path} lists {token!r} twice (ids {position[token]}, {i})"
            )
        position[token] = i
    if sorted(special_tokens) != sorted(ROLES):
        raise SourceError(f"special_tokens must name exactly {', '.join(ROLES)}")
    specials: dict[str, int | None] = {}
    for role in ROLES:
        if role == "bos" and special_tokens[role] is None:
            specials[role] = None
        elif special_tokens[role] not in position:
            raise SourceError(f"special token {role} {special_tokens[role]!r} is not in {path}")
        else:
            specials[role] = position[special_tokens[role]]
    if len(set(specials.values())) != len(ROLES):  # None counts once
        raise SourceError(f"special tokens must be distinct tokens, got {special_tokens}")
    for name in SPECIAL_TOKENS:
        if name in position and position[name] not in specials.values():
            raise SourceError(f"{path} has {name!r} as an ordinary token; edgeseq reserves it")
    return Vocabulary(path, tokens, specials, data)


def pad_vocabulary(tokenizer: Tokenizer, size: int, source: Path) -> int:
    """Give `tokenizer` (edgeseq ids) `size` ids by adding special tokens UNUSED.format(id)
    that no text produces (an embedding with more rows than its tokenizer has ids); refuse a
    tokenizer with more ids than that. Returns how many were added."""
    have = tokenizer.vocab_size
    if have > size:
        raise SourceError(
            f"the tokenizer has {have} ids but the model's embedding has {size} rows: the "
            f"tokenizer ({source}) is not this model's (use the checkpoint's own tokenizer files)"
        )
    tokenizer.hf.add_special_tokens(
        [AddedToken(UNUSED.format(i), special=True, normalized=False) for i in range(have, size)]
    )
    if tokenizer.vocab_size != size:
        raise SourceError(f"{source}: cannot pad the tokenizer to {size} ids")
    return size - have
