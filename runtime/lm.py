"""GPT and BERT bundles in the torch-free API: `Generator.load` returns one of these for a
bundle whose config.json says "decoder-only" or "encoder-only" (docs/runtime.md).

    gpt = Generator.load("bundles/words")              # a GPTGenerator
    [r] = gpt.generate(["photo"])                      # r.text "photon": prompt + continuation
    bert = Generator.load("bundles/stress")            # a BertClassifier
    [r] = bert.generate(["banana"])                    # r.text "2": the predicted label
    bert.predict(["banana"])[0].probabilities          # {"1": 0.01, "2": 0.97, ...}
    bert.embed(["banana", "photo"])                    # float32 (2, d_model), mean-pooled

Both are `Generator`s, so `edgeseq generate`, `edgeseq serve` and the API treat the three
kinds alike: one Result per input, the same normalisation and input rules. A GPT result's
`text` is the normalised prompt followed by the continuation (`token_ids` are the
continuation's); an empty prompt is run (the model invents from `<s>`). A BERT result's
`text` is the label with the highest probability, `score` and `logprob` its log-probability,
`nbest` every label in order of probability.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from . import lm_constants as L
from .bundle import Bundle
from .constants import SPECIAL_TOKENS
from .errors import BundleError, InputTooLongError, OptionsError
from .generator import Candidate, Generator, Result, Source
from .lm_step import OrtGPTStep
from .padding import right_pad
from .providers import Providers, open_session
from .search import GenerationOptions


def check_lm_graph(bundle: Bundle, session: ort.InferenceSession, variant: str) -> None:
    """Refuse a GPT or BERT graph whose inputs, outputs or widths disagree with config.json."""
    cfg, path = bundle.config, bundle.model_graph(variant)
    if cfg.architecture == L.DECODER_ONLY:
        inputs, outputs = L.gpt_inputs(cfg.n_decoder_layers), L.gpt_outputs(cfg.n_decoder_layers)
    else:
        inputs, outputs = L.BERT_INPUTS, L.BERT_OUTPUTS
    got_in = tuple(arg.name for arg in session.get_inputs())
    got_out = tuple(arg.name for arg in session.get_outputs())
    if set(got_in) != set(inputs) or set(got_out) != set(outputs):
        missing = [n for n in (*inputs, *outputs) if n not in (*got_in, *got_out)]
        raise BundleError(
            f"{path} does not match config.json's {cfg.architecture} model (missing "
            f"inputs/outputs {missing[:4]}); re-export the bundle"
        )
    width = {arg.name: arg.shape for arg in session.get_outputs()}[L.LOGITS][-1]
    if isinstance(width, int) and width != cfg.tgt_vocab_size:
        raise BundleError(
            f"{path}: logits width {width} but config.json's tgt_vocab_size is "
            f"{cfg.tgt_vocab_size}; re-export the bundle"
        )


def load_lm(
    bundle: Bundle,
    providers: Providers = None,
    threads: int | None = None,
    variant: str | None = None,
    optimization: str = "all",
) -> GPTGenerator | BertClassifier:
    """Open a GPT or BERT bundle's graph `variant` (default: `Bundle.default_variant`)."""
    variant = variant or bundle.default_variant
    session, device = open_session(bundle.model_graph(variant), providers, threads, optimization)
    check_lm_graph(bundle, session, variant)
    if bundle.architecture == L.DECODER_ONLY:
        return GPTGenerator(bundle, OrtGPTStep(session, bundle.config), device, None, "loop")
    return BertClassifier(bundle, session, device)


class GPTGenerator(Generator):
    """Continues prompts with a GPT bundle; the search code is the encoder–decoder's."""

    runs_empty_input = True

    def encode(self, text: str, truncate: bool = False) -> Source:
        """Token ids of the normalised prompt (no `<s>`, no `</s>`; may be empty). The
        prompt and `<s>` must leave the positional table room for one new token:
        InputTooLongError, or with `truncate` the prompt's last tokens are kept. A prompt
        of unknown symbols only is `skipped` "unknown"."""
        ids, unknown = self.tokenize(text)
        if ids and len(unknown) == len(ids):
            return Source((), False, unknown, "unknown")
        limit = self.config.max_len - 2  # <s>, the prompt and one new token
        truncated = len(ids) > limit
        if truncated and not truncate:
            raise InputTooLongError(
                f"the prompt has {len(ids)} tokens but the model's max_len "
                f"{self.config.max_len} leaves room for {limit} (with <s> and one new token); "
                "shorten it or pass truncate=True"
            )
        return Source(tuple(ids[len(ids) - limit :] if truncated else ids), truncated, unknown)

    def _options(self, sources: Sequence[Source], options: GenerationOptions) -> GenerationOptions:
        """`options` with max_new_tokens within what the longest prompt leaves of max_len."""
        room = self.config.max_len - 1 - max((len(s.ids) for s in sources), default=0)
        wanted = options.max_new_tokens
        fitted = room if wanted is None else min(wanted, room)
        return dataclasses.replace(options, max_new_tokens=fitted)

    def generate(
        self, texts: Sequence[str], options: GenerationOptions | None = None
    ) -> list[Result]:
        """One Result per prompt, in order (batched as `Generator.generate`): `text` is the
        normalised prompt + the continuation. A batch generates at most as many tokens as
        its longest prompt leaves of max_len."""
        if isinstance(texts, str):
            raise OptionsError("generate() takes a list of texts; wrap a single text in [ ]")
        options = options or GenerationOptions()
        results: list[Result] = []
        for start in range(0, len(texts), options.batch_size):
            chunk = list(texts[start : start + options.batch_size])
            sources = [self.encode(t, options.truncate) for t in chunk]
            fitted = self._options([s for s in sources if not s.skipped], options)
            results += [self._with_prompt(r) for r in super().generate(chunk, fitted)]
        return results

    def _with_prompt(self, result: Result) -> Result:
        """`result` with the decoded prompt in front of each hypothesis's text."""
        if result.skipped:
            return result
        prompt = self.tokenizers.source.decode(list(result.source.ids))
        nbest = tuple(dataclasses.replace(c, text=prompt + c.text) for c in result.nbest)
        return dataclasses.replace(result, text=prompt + result.text, nbest=nbest)

    def stream(self, text: str, options: GenerationOptions | None = None) -> Iterator[str]:
        """Yield the normalised prompt, then each piece of the continuation as it is chosen
        (greedy or sampling); the pieces join to `generate([text], options)[0].text`."""
        options = options or GenerationOptions()
        source = self.encode(text, options.truncate)
        if source.skipped:
            return iter(())
        pieces = super().stream(text, self._options([source], options))
        prompt = self.tokenizers.source.decode(list(source.ids))
        return _prepend(prompt, pieces)


def _prepend(first: str, rest: Iterator[str]) -> Iterator[str]:
    if first:
        yield first
    yield from rest


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

    def _run(self, sources: Sequence[Source]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(last_hidden_state float32 (B, S, D), logits float32 (B, C), mask int64 (B, S))."""
        ids = right_pad([s.ids for s in sources], self.config.pad_id)
        mask = (ids != self.config.pad_id).astype(np.int64)
        hidden, logits = self.session.run(
            list(L.BERT_OUTPUTS), {L.INPUT_IDS: ids, L.ATTENTION_MASK: mask}
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
