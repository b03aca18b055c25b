"""What generating one input returns (`Source`, `Candidate`, `Result`, for every kind of
bundle) and its JSON form: the fields of `edgeseq generate --json`, also
returned by `edgeseq serve` (one serializer, so the two never drift apart).

    result_json(1, "abc", result, generator.tokenizers.target)
    {"index": 1, "input": "abc", "output": "cba", "ids": [...], "tokens": [...], "score": ...,
     "logprob": ..., "finished": true, "truncated": false, "unknown": []}

An input with no known symbol is not run: for "" the object is
`{"index": 2, "input": "", "output": "", "skipped": "empty"}` ("unknown" when every symbol
is outside the vocabulary). With n-best > 1 the object
gains `"nbest"`: a list of {"output", "ids", "score", "logprob"}, best first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .tokenizer import Tokenizer, utf8_text


@dataclass(frozen=True)
class Source:
    """An encoded input: token ids with `</s>` appended."""

    ids: tuple[int, ...]
    truncated: bool  # tokens were cut to fit max_len
    unknown: tuple[str, ...]  # input symbols outside the source vocabulary (fed as <unk>)
    # Why the input is not run: "empty" (no token after normalisation), "unknown" (every
    # token is outside the vocabulary); None for an input the model runs.
    skipped: str | None = None

    @property
    def sample_key(self) -> int:
        """64-bit key of the ids that seeds this input's sampling Generator."""
        digest = hashlib.sha256(np.asarray(self.ids, dtype=np.int64).tobytes()).digest()
        return int.from_bytes(digest[:8], "little")

    @classmethod
    def joined(cls, sources: Sequence[Source]) -> Source:
        """The Source of an input split into `sources` (its sentences): their ids one after
        the other, truncated or unknown symbols where any has them; skipped only when every
        sentence is (as the first is)."""
        run = [s for s in sources if not s.skipped]
        return cls(
            tuple(i for s in sources for i in s.ids),
            any(s.truncated for s in sources),
            tuple(dict.fromkeys(u for s in sources for u in s.unknown)),
            None if run else sources[0].skipped,
        )


@dataclass(frozen=True)
class Candidate:
    """One generated hypothesis of an input."""

    text: str
    token_ids: tuple[int, ...]  # without `<s>` and `</s>`
    score: float  # logprob / length ** length_penalty
    logprob: float  # sum of the tokens' log-probabilities (`</s>` included when finished)
    finished: bool  # ended with `</s>` (False: cut by max_new_tokens or max_len)


@dataclass(frozen=True)
class Result:
    """What one input generated: the best hypothesis, and the n-best list (beam search)."""

    text: str
    token_ids: tuple[int, ...]
    score: float
    logprob: float
    finished: bool
    nbest: tuple[Candidate, ...]  # best first; nbest[0] is the result itself (empty if skipped)
    source: Source

    @property
    def skipped(self) -> str | None:
        """Why the input was not run ("empty", "unknown"), or None; see `Source.skipped`."""
        return self.source.skipped

    @classmethod
    def skipped_result(cls, source: Source) -> Result:
        """The Result of an input that is not run: empty text, no tokens, not finished."""
        return cls("", (), 0.0, 0.0, False, (), source)

    @classmethod
    def joined(cls, results: Sequence[Result], separator: str) -> Result:
        """One input's Result from its sentences' `results`, in order: their texts joined by
        `separator` and their ids one after the other (skipped sentences left out), score
        and logprob summed, finished when every sentence finished."""
        source = Source.joined([r.source for r in results])
        run = [r for r in results if not r.skipped]
        if not run:
            return cls.skipped_result(source)
        best = Candidate(
            separator.join(r.text for r in run),
            tuple(i for r in run for i in r.token_ids),
            float(sum(r.score for r in run)),
            float(sum(r.logprob for r in run)),
            all(r.finished for r in run),
        )
        return cls(
            best.text, best.token_ids, best.score, best.logprob, best.finished, (best,), source
        )


def result_json(index: int, text: str, result: Result | None, target: Tokenizer) -> dict[str, Any]:
    """The JSON object for input number `index` (from 1) with text `text`; `result` None
    (or a skipped Result) means the input was not run. `target` names the output tokens."""
    out: dict[str, Any] = {"index": index, "input": utf8_text(text)}  # as the model read it
    if result is None or result.skipped:
        return out | {"output": "", "skipped": result.skipped if result else "empty"}
    out |= {
        "output": result.text,
        "ids": list(result.token_ids),
        "tokens": [target.id_to_token(i) for i in result.token_ids],
        "score": result.score,
        "logprob": result.logprob,
        "finished": result.finished,
        "truncated": result.source.truncated,
        "unknown": list(result.source.unknown),
    }
    if len(result.nbest) > 1:
        out["nbest"] = [
            {"output": c.text, "ids": list(c.token_ids), "score": c.score, "logprob": c.logprob}
            for c in result.nbest
        ]
    return out
