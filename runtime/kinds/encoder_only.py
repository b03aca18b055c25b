"""The encoder-only (BERT) kind in the runtime: `BertClassifier`, which `Generator.load`
returns for such a bundle: labels, their probabilities and embeddings of `model.onnx`.

    bert = Generator.load("bundles/stress")            # a BertClassifier
    [r] = bert.generate(["banana"])                    # r.text "2": the predicted label
    bert.predict(["banana"])[0].probabilities          # {"1": 0.01, "2": 0.97, ...}
    bert.embed(["banana", "photo"])                    # float32 (2, d_model), mean-pooled

A GPT or BERT bundle is a `Generator` like an encoder–decoder's, so `edgeseq generate`,
`edgeseq serve` and the API treat the three kinds alike: one Result per input, the same
normalisation and input rules. A BERT result's `text` is the label with the highest
probability, `score` and `logprob` its log-probability, `nbest` every label in order of
probability. (A GPT result's `text` is the normalised prompt followed by the continuation:
runtime/kinds/decoder_only.py.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..bundle import Bundle
from ..constants import SPECIAL_TOKENS
from ..errors import InputTooLongError, OptionsError
from ..generator import Generator, OpenOptions
from ..padding import right_pad
from ..results import Candidate, Result, Source
from ..search import GenerationOptions
from .decoder_only import open_model_graph


@dataclass(frozen=True)
class Prediction:
    """A BERT bundle's answer for one input: the label and the probability of every label."""

    label: str
    probability: float
    probabilities: dict[str, float]  # label -> probability, most likely first
    source: Source


class BertClassifier(Generator):
    """Classifies texts with a BERT bundle (`predict`, or `generate` for the common Result)
    and returns their embeddings (`embed`)."""

    def __init__(self, bundle: Bundle, session: ort.InferenceSession, device: str) -> None:
        super().__init__(bundle, None, device, None, "loop")
        self.session = session

    @classmethod
    def open(cls, bundle: Bundle, how: OpenOptions) -> BertClassifier:
        """Open `model.onnx` of `how.variant` (see `Generator.load`)."""
        session, device = open_model_graph(bundle, how)
        return cls(bundle, session, device)

    def _run(self, sources: Sequence[Source]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(last_hidden_state float32 (B, S, D), logits float32 (B, C), mask int64 (B, S))."""
        ids = right_pad([s.ids for s in sources], self.config.pad_id)
        mask = (ids != self.config.pad_id).astype(np.int64)
        hidden, logits = self.session.run(
            list(C.BERT_OUTPUTS), {C.INPUT_IDS: ids, C.ATTENTION_MASK: mask}
        )
        return hidden, logits, mask

    def _batches(
        self, texts: Sequence[str], batch_size: int, truncate: bool
    ) -> Iterator[tuple[list[int], list[Source], list[int]]]:
        """For each group of `batch_size` texts in input order: (indices of the group's
        inputs that are run, every input's Source, the group's indices)."""
        if isinstance(texts, str):
            raise OptionsError("takes a list of texts; wrap a single text in [ ]")
        sources = []
        for index, text in enumerate(texts):
            try:
                sources.append(self.encode(text, truncate))
            except InputTooLongError as exc:
                raise InputTooLongError(f"input {index}: {exc}") from None
        for start in range(0, len(sources), batch_size):
            rows = list(range(start, min(start + batch_size, len(sources))))
            yield [i for i in rows if not sources[i].skipped], sources, rows

    def predict(
        self, texts: Sequence[str], batch_size: int = 32, truncate: bool = False
    ) -> list[Prediction | None]:
        """One Prediction per text (None for a skipped input: see `Source.skipped`)."""
        out: list[Prediction | None] = []
        for run, sources, rows in self._batches(texts, batch_size, truncate):
            probs = self._probabilities([sources[i] for i in run]) if run else None
            by_row = dict(zip(run, probs, strict=True)) if run else {}
            for i in rows:
                out.append(self._prediction(sources[i], by_row[i]) if i in by_row else None)
        return out

    def _probabilities(self, sources: Sequence[Source]) -> np.ndarray:
        """float64 (B, C - 4): softmax over the non-special labels (ids 4...)."""
        logits = self._run(sources)[1][:, len(SPECIAL_TOKENS) :].astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return exp / exp.sum(axis=1, keepdims=True)

    def _prediction(self, source: Source, probs: np.ndarray) -> Prediction:
        order = np.argsort(-probs, kind="stable")
        names = [self.label_name(int(k) + len(SPECIAL_TOKENS)) for k in order]
        table = {name: float(probs[k]) for name, k in zip(names, order, strict=True)}
        return Prediction(names[0], float(probs[order[0]]), table, source)

    def label_name(self, label_id: int) -> str:
        """The label of id `label_id` (the target tokenizer's token)."""
        return self.tokenizers.target.decode([label_id])

    def generate(
        self, texts: Sequence[str], options: GenerationOptions | None = None
    ) -> list[Result]:
        """One Result per text: `text` the most likely label, `score`/`logprob` its
        log-probability, `nbest` every label, most likely first. Only greedy options apply
        (a classifier has no search)."""
        options = options or GenerationOptions()
        if options.method != "greedy" or options.max_new_tokens is not None:
            raise OptionsError(
                "a BERT bundle predicts one label per input: beam search, sampling and "
                "max_new_tokens do not apply (--json lists every label's log-probability)"
            )
        results: list[Result] = []
        for run, sources, rows in self._batches(texts, options.batch_size, options.truncate):
            probs = self._probabilities([sources[i] for i in run]) if run else None
            by_row = dict(zip(run, probs, strict=True)) if run else {}
            for i in rows:
                if i not in by_row:
                    results.append(Result.skipped_result(sources[i]))
                    continue
                order = np.argsort(-by_row[i], kind="stable")
                nbest = tuple(
                    Candidate(
                        self.label_name(int(k) + len(SPECIAL_TOKENS)),
                        (int(k) + len(SPECIAL_TOKENS),),
                        float(np.log(by_row[i][k])),
                        float(np.log(by_row[i][k])),
                        True,
                    )
                    for k in order
                )
                best = nbest[0]
                results.append(
                    Result(
                        best.text,
                        best.token_ids,
                        best.score,
                        best.logprob,
                        True,
                        nbest,
                        sources[i],
                    )
                )
        return results

    def embed(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        per_token: bool = False,
        truncate: bool = False,
    ) -> np.ndarray | list[np.ndarray]:
        """Embeddings of `texts` (final hidden states, `</s>` included): float32
        (B, d_model) averaged over each text's tokens, or with `per_token` one float32
        (T_i, d_model) array per text. A skipped input gives zeros (or a (0, d_model) array)."""
        width = self.config.d_model
        pooled = np.zeros((len(texts), width), dtype=np.float32)
        tokens: list[np.ndarray] = [np.zeros((0, width), np.float32) for _ in texts]
        for run, sources, _ in self._batches(texts, batch_size, truncate):
            if not run:
                continue
            hidden, _, mask = self._run([sources[i] for i in run])
            weights = mask[..., None].astype(np.float32)
            means = (hidden * weights).sum(axis=1) / weights.sum(axis=1)
            for row, i in enumerate(run):
                pooled[i] = means[row]
                tokens[i] = hidden[row, : int(mask[row].sum())].copy()
        return tokens if per_token else pooled

    def stream(self, text: str, options: GenerationOptions | None = None) -> Iterator[str]:
        """Refused: a classifier answers at once (use `generate` or `predict`)."""
        raise OptionsError("a BERT bundle predicts a label at once; streaming does not apply")


GENERATOR = BertClassifier
