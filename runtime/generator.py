"""Generate with an exported bundle: the torch-free API.

    gen = Generator.load("bundles/rev")                # $EDGESEQ_PROVIDER, else "auto"
    gen = Generator.load("g2p-en")                     # a built-in bundle (edgeseq models)
    gen = Generator.load("bundles/nllb", target_lang="fra_Latn")  # a default target language
    [r] = gen.generate(["abc"], GenerationOptions(beam_size=4, n_best=2))
    r.text, r.token_ids, r.score, [c.text for c in r.nbest]
    for piece in gen.stream("abc"):                    # greedy or sampling, token by token
        print(piece, end="", flush=True)

A source is its normalised tokens plus `</s>`, as in training. An input with no symbol of
the source vocabulary after normalisation (empty, only whitespace, only unknown symbols) is
not run: its Result has empty text and `skipped` "empty" or "unknown" (see `Source`).
Batching is fixed by the input order alone: inputs are taken `batch_size` at a time, and the
inputs of one group that are not skipped run as one engine batch; results come back in input
order. The CLI and the server batch the same way, so equal inputs and options give equal
outputs everywhere. With fp32 graphs the batch does not change a result's tokens (its
scores can move in the 7th significant digit: docs/runtime.md); with int8 graphs the
tokens can change too (dynamic quantization scales activations per tensor, over the whole
batch), which is why the policy is fixed. With `sample=True` each input draws from its own
numpy Generator seeded by (seed, the input's token ids), so a seeded fp32 result depends only
on the input and the options (identical inputs get identical samples; vary the seed for
different draws).

A `Generator` is safe to share between threads: onnxruntime sessions may run concurrently
and every call keeps its state local.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .bundle import Bundle, load_bundle
from .config import ModelConfig
from .cpu_features import saturation_warning
from .errors import InputTooLongError, OptionsError
from .graph_search import (
    SEARCH_MODES,
    GraphSearch,
    auto_graph_max_hypotheses,
    unsupported_reason,
)
from .kinds import generator_class
from .languages import forced_target_ids, no_languages, source_start, with_default_target
from .lazy import Lazy
from .padding import right_pad
from .prefix import forced
from .providers import Providers, check_providers
from .results import Candidate, Result, Source
from .rules import with_rules
from .search import (
    Chooser,
    GenerationOptions,
    Hypothesis,
    choose_argmax,
    decode_steps,
    row_rngs,
    sampling_chooser,
    search,
    step_budget,
)
from .sentences import joiner, sentences, splitter_language
from .step import StepModel
from .tokenizer import TokenizerPair, utf8_text

__all__ = ["Candidate", "Generator", "OpenOptions", "Result", "Source"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenOptions:
    """How `Generator.load` asks a kind to open a bundle (see `load` for each field)."""

    providers: Providers
    threads: int | None
    variant: str
    optimization: str
    search: str


class Generator:
    """A loaded bundle and its step model; `generate` and `stream` text.

    The text-in, text-out API shared by every kind of bundle: normalising and encoding
    inputs, batching, search over a `StepModel`, results. `Generator.load` returns the class
    of the bundle's kind (runtime/kinds/), which opens the graphs and adapts what differs."""

    runs_empty_input = False  # an empty text has nothing to read (a GPT continues "" from <s>)

    def __init__(
        self,
        bundle: Bundle,
        step_model: StepModel | None,
        device: str = "cpu",
        graph_search: GraphSearch | Lazy[GraphSearch] | None = None,
        search_mode: str = "auto",
    ) -> None:
        self.bundle = bundle
        self.step_model = step_model
        self.device = device  # "cuda" or "cpu": where the graphs run
        # the one-graph variant's session, or its opener (runtime/lazy.py), when the bundle has it
        self._graph_search = graph_search
        self.search_mode = search_mode  # "auto", "graph" or "loop": see `uses_graph`
        self.variant = bundle.default_variant  # the graph variant running (`load` sets it)

    @classmethod
    def load(
        cls,
        bundle_dir: str | Path,
        providers: Providers = None,
        threads: int | None = None,
        variant: str | None = None,
        optimization: str = "all",
        search: str = "auto",
        target_lang: str | None = None,
    ) -> Generator:
        """Check and open the bundle at `bundle_dir` (a directory, or a built-in name such
        as "g2p-en"; see `load_bundle`), graph `variant` (default: `Bundle.default_variant`),
        on `providers` ("auto", "cuda", "cpu", or a list of onnxruntime provider names such
        as ["OpenVINOExecutionProvider", "CPUExecutionProvider"]; default $EDGESEQ_PROVIDER,
        else "auto"; see runtime/providers.py) with `threads` intra-op threads (default: every
        core). `search`: "auto" runs greedy and beam search in the bundle's one-graph search
        variant when it has one for `variant`'s precision, "graph" insists on it, "loop"
        always drives the two graphs from Python (runtime/graph_search.py). `target_lang`: the
        default target language of a multilingual model instead of the bundle's (a request's
        own `target_lang` still wins); OptionsError for a code the model does not have."""
        providers = check_providers(providers)
        if search not in SEARCH_MODES:
            raise OptionsError(
                f"unknown search {search!r}; choose one of {', '.join(SEARCH_MODES)}"
            )
        bundle = load_bundle(bundle_dir)
        if target_lang is not None:
            languages = with_default_target(bundle.languages, target_lang)
            bundle = replace(bundle, languages=languages)
        kind = generator_class(bundle.architecture)  # runtime/kinds/: one module per kind
        variant = variant or bundle.default_variant
        warning = saturation_warning(bundle.manifest, variant)
        if warning is not None:
            logger.warning("%s: %s", bundle.path, warning)
        generator = kind.open(
            bundle, OpenOptions(providers, threads, variant, optimization, search)
        )
        generator.variant = variant
        return generator

    def loop_model(self, options: GenerationOptions) -> StepModel:
        """The step model the two-graph loop runs `options` on (kinds with more than one
        decoder graph choose per search method)."""
        assert self.step_model is not None, "a kind without a step model has no loop"
        return self.step_model

    @classmethod
    def open(cls, bundle: Bundle, how: OpenOptions) -> Generator:
        """Open `bundle`'s graphs as `how` says, for this kind (each kind overrides it)."""
        raise NotImplementedError(f"{cls.__name__} does not open bundles; use Generator.load")

    @property
    def has_graph_search(self) -> bool:
        """Whether the one-graph search variant of the running precision can be used."""
        return self._graph_search is not None

    @property
    def graph_search(self) -> GraphSearch | None:
        """The one-graph search variant's session (opened on first use), or None."""
        graph = self._graph_search
        return graph.get() if isinstance(graph, Lazy) else graph

    def uses_graph(self, options: GenerationOptions, rows: int | None = None) -> bool:
        """Whether `generate` runs an engine batch of `rows` inputs (default
        options.batch_size) in the one-graph variant: with search "graph" whenever it is
        loaded and supports the options (no sampling); with "auto" also only while rows x
        beam_size <= `graph_search.auto_graph_max_hypotheses` of the bundle's config and
        device (on the CPU a step-compute budget: larger batches and models run on the loop,
        which drops finished inputs; on CUDA no limit). Search "graph" with options it cannot
        run raises OptionsError."""
        if not self.has_graph_search or self.search_mode == "loop":
            return False
        options = self.resolve(options)  # unset fields: the bundle's defaults
        reason = unsupported_reason(options)
        if reason is not None and self.search_mode == "graph":
            raise OptionsError(f"search 'graph' cannot run these options: {reason}; use 'auto'")
        if reason is not None:
            return False
        if self.search_mode == "graph":
            return True
        limit = auto_graph_max_hypotheses(self.config, self.device)
        held = (options.batch_size if rows is None else rows) * options.beam_size
        return limit is None or held <= limit

    @property
    def config(self) -> ModelConfig:
        """The model's configuration."""
        return self.bundle.config

    @property
    def tokenizers(self) -> TokenizerPair:
        """Source and target tokenizers."""
        return self.bundle.tokenizers

    def tokenize(self, text: str) -> tuple[list[int], tuple[str, ...]]:
        """Source token ids of normalised `text` (no special tokens) and the input symbols
        that became `<unk>` (as the model sees them, "?" where a symbol has no span). An
        unpaired surrogate (JSON can carry one, UTF-8 cannot) is read as U+FFFD, as the CLI
        reads bytes that are not UTF-8."""
        tokenizer = self.tokenizers.source
        text = utf8_text(text)
        encoding = tokenizer.hf.encode(text, add_special_tokens=False)
        ids = list(encoding.ids)
        unknown = tuple(
            text[start:end] or "?"
            for i, (start, end) in zip(ids, encoding.offsets, strict=True)
            if i == tokenizer.unk_id
        )
        return ids, unknown

    def encode(self, text: str, truncate: bool = False, source_lang: str | None = None) -> Source:
        """Token ids of normalised `text` plus `</s>`, after `<s>` when config.source_bos and
        the source language's token for a multilingual model (`source_lang`, default the
        model's). Longer than max_len (`ModelConfig.max_positions`: positional "relative" has
        no table): InputTooLongError, or with `truncate` the tokens are cut to fit.
        No known symbol: a Source marked `skipped` (never too long)."""
        ids, unknown = self.tokenize(text)
        prefix = self._source_prefix(source_lang)
        limit = self.config.max_positions - len(prefix)
        eos = self.config.eos_id
        if not ids or len(unknown) == len(ids):
            skipped = "unknown" if ids else "empty"
            return Source((*prefix, *ids[: limit - 1], eos), False, unknown, skipped)
        truncated = len(ids) + 1 > limit
        if truncated and not truncate:
            raise InputTooLongError(
                f"input has {len(prefix) + len(ids) + 1} source tokens with </s> but the "
                f"model's max_len is {self.config.max_positions}; shorten it or pass truncate=True"
            )
        return Source((*prefix, *ids[: limit - 1], eos), truncated, unknown)

    def task_text(self, text: str, options: GenerationOptions) -> str:
        """`text` after the prefix of `options.task` (the bundle's task_prefixes), as
        transformers' pipelines put it before T5's inputs; `text` itself without a task."""
        return text if options.task is None else self.bundle.task_prefix(options.task) + text

    def encode_input(self, text: str, options: GenerationOptions) -> Source:
        """`encode` of `text` as resolved `options` run it: with split_sentences, the joined
        Source of its sentences (`Source.joined`), each checked against max_len
        (InputTooLongError naming the sentence)."""
        if not options.split_sentences:
            return self.encode(self.task_text(text, options), options.truncate, options.source_lang)
        encoded = []
        for number, sentence in enumerate(sentences(text, splitter_language(options.source_lang))):
            try:
                sentence = self.task_text(sentence, options)
                encoded.append(self.encode(sentence, options.truncate, options.source_lang))
            except InputTooLongError as exc:
                raise InputTooLongError(f"sentence {number + 1}: {exc}") from None
        return Source.joined(encoded)

    def _source_prefix(self, source_lang: str | None) -> list[int]:
        """The ids before a source's tokens: `<s>` when config.source_bos (BART), then the
        source language's token for a multilingual model."""
        if self.bundle.languages is None:
            no_languages(GenerationOptions(source_lang=source_lang))
        return source_start(self.config, self.bundle.languages, source_lang)

    def resolve(self, options: GenerationOptions) -> GenerationOptions:
        """`options` with the model's default languages filled in, and every unset field
        (None) from the bundle's generation settings, else edgeseq's defaults
        (`GenerationOptions.filled`); OptionsError (one line) for a language the model does
        not have, or any language for a model without a language list. generate, stream and
        the server call it first."""
        if self.bundle.languages is None:
            no_languages(options)
        else:
            options = self.bundle.languages.resolve(options)
        for name in ("split_sentences", "target_prefix"):
            if getattr(options, name) and self.config.architecture != "encoder-decoder":
                raise OptionsError(f"{name} applies to encoder-decoder bundles only")
        options = options.filled(self.bundle.generation)
        if options.task is not None:
            if self.config.architecture != "encoder-decoder":
                raise OptionsError("task applies to encoder-decoder bundles only")
            self.bundle.task_prefix(options.task)  # OptionsError naming the known tasks
        forced_ids, budget = len(self.target_prefix(options)), options.max_new_tokens
        cap = self.config.max_positions  # past max_len for positional "relative"
        budget = self.config.max_len if budget is None else min(budget, cap)
        if forced_ids >= budget:
            raise OptionsError(
                f"the forced target prefix takes {forced_ids} of the {budget} tokens an "
                "output may have: raise max_new_tokens or shorten target_prefix"
            )
        return options

    def target_prefix(self, options: GenerationOptions) -> list[int]:
        """The ids forced as the first generated tokens for resolved `options`."""
        return forced_target_ids(self.bundle.languages, self.tokenizers.target, options)

    def search_model(self, options: GenerationOptions) -> StepModel:
        """The loop's step model for resolved `options`, forcing the target language and
        prefix (`target_prefix`)."""
        return forced(self.loop_model(options), [self.target_prefix(options)])

    def _padded(self, sources: Sequence[Source]) -> np.ndarray:
        """Right-padded int64 (B, S_max) of sources' ids."""
        return right_pad([s.ids for s in sources], self.config.pad_id)

    def _candidate(self, hyp: Hypothesis) -> Candidate:
        text = self.tokenizers.target.decode(hyp.tokens)
        return Candidate(text, hyp.tokens, hyp.score, hyp.logprob, hyp.finished)

    def generate(
        self,
        texts: Sequence[str],
        options: GenerationOptions | None = None,
        *,
        task: str | None = None,
    ) -> list[Result]:
        """One Result per text, in order (batched as the module docstring says; skipped
        inputs get `Result.skipped_result`). Raises InputTooLongError naming the first
        over-long input (index from 0) unless options.truncate. `task`: a task of the
        bundle's task_prefixes, whose prefix goes before every text (as options.task)."""
        if isinstance(texts, str):
            raise OptionsError("generate() takes a list of texts; wrap a single text in [ ]")
        options = options or GenerationOptions()
        options = self.resolve(replace(options, task=task) if task is not None else options)
        if options.split_sentences:
            return self._generate_sentences(texts, options)
        sources = []
        for index, text in enumerate(texts):
            try:
                sources.append(self.encode_input(text, options))
            except InputTooLongError as exc:
                raise InputTooLongError(f"input {index}: {exc}") from None
        self.uses_graph(options)  # search "graph" refuses options it cannot run, up front
        results = [Result.skipped_result(s) if s.skipped else None for s in sources]
        for start in range(0, len(sources), options.batch_size):
            group = range(start, min(start + options.batch_size, len(sources)))
            rows = [i for i in group if results[i] is None]
            if not rows:
                continue
            batch = [sources[i] for i in rows]
            rngs = row_rngs(options, [s.sample_key for s in batch]) if options.sample else None
            graph = self.graph_search if self.uses_graph(options, len(rows)) else None
            hyps, unsure = graph.run(self._padded(batch), options) if graph else (None, [])
            if hyps is None or (any(unsure) and self.search_mode == "auto"):
                # the loop's answer where the graph's could differ (graph_search.may_differ)
                hyps = search(self.search_model(options), self._padded(batch), options, rngs)
            for i, row_hyps in zip(rows, hyps, strict=True):
                nbest = tuple(self._candidate(h) for h in row_hyps)
                best = nbest[0]
                results[i] = Result(
                    best.text,
                    best.token_ids,
                    best.score,
                    best.logprob,
                    best.finished,
                    nbest,
                    sources[i],
                )
        return [r for r in results if r is not None]

    def _generate_sentences(self, texts: Sequence[str], options: GenerationOptions) -> list[Result]:
        """`generate` with split_sentences: every input's sentences (runtime/sentences.py)
        generated as one list of inputs (batched as `generate` batches), each input's
        results joined in order (`Result.joined`)."""
        for index, text in enumerate(texts):  # every sentence fits, before anything runs
            try:
                self.encode_input(text, options)
            except InputTooLongError as exc:
                raise InputTooLongError(f"input {index}, {exc}") from None
        language = splitter_language(options.source_lang)
        parts = [sentences(text, language) for text in texts]
        flat = [sentence for part in parts for sentence in part]
        results = self.generate(flat, replace(options, split_sentences=False))
        separator, out, start = joiner(options.target_lang), [], 0
        for part in parts:
            out.append(Result.joined(results[start : start + len(part)], separator))
            start += len(part)
        return out

    def stream(
        self, text: str, options: GenerationOptions | None = None, *, task: str | None = None
    ) -> Iterator[str]:
        """Yield the text pieces of one input's output as tokens are chosen (greedy or
        sampling; beam search decides only at the end). The pieces join to the text of
        `generate([text], options)[0]`. Errors (too long, beam, a model whose default is
        beam search, split_sentences) raise at the call. `task` as for `generate`."""
        options = options or GenerationOptions()
        options = self.resolve(replace(options, task=task) if task is not None else options)
        if options.method == "beam":
            raise OptionsError(
                "stream() yields each token as it is chosen, which beam search cannot do "
                f"(beam_size {options.beam_size}, the model's default unless set): use "
                "beam_size=1 (greedy or sampling), or generate()"
            )
        if options.split_sentences:
            raise OptionsError("stream() yields one input's tokens: drop split_sentences")
        source = self.encode(self.task_text(text, options), options.truncate, options.source_lang)
        if source.skipped:
            return iter(())
        if options.sample:
            choose = sampling_chooser(options, row_rngs(options, [source.sample_key]))
        else:
            choose = choose_argmax
        src_ids = np.array([source.ids], dtype=np.int64)
        return self._pieces(src_ids, options, choose)

    def _pieces(
        self, src_ids: np.ndarray, options: GenerationOptions, choose: Chooser
    ) -> Iterator[str]:
        tokens: list[int] = []
        emitted = ""
        model = self.search_model(options) if self.step_model is not None else self.step_model
        budget = step_budget(model, options.max_new_tokens)
        steps = decode_steps(with_rules(model, options, budget), src_ids, budget, choose)
        for _, next_ids, _ in steps:
            token = int(next_ids[0])
            if token == self.config.eos_id:
                return
            tokens.append(token)
            text = self.tokenizers.target.decode(tokens)
            if len(text) > len(emitted) and text.startswith(emitted):
                yield text[len(emitted) :]
                emitted = text
