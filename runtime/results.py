"""The JSON form of one generated input: the fields of `edgeseq generate --json`, also
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

from typing import Any

from .generator import Result
from .tokenizer import Tokenizer


def result_json(index: int, text: str, result: Result | None, target: Tokenizer) -> dict[str, Any]:
    """The JSON object for input number `index` (from 1) with text `text`; `result` None
    (or a skipped Result) means the input was not run. `target` names the output tokens."""
    out: dict[str, Any] = {"index": index, "input": text}
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
