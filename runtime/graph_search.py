"""Generate with the one-graph search variant: one `session.run` per batch, no Python loop.

    graph = GraphSearch.open(bundle, "fp32", ["CPUExecutionProvider"], options)
    hyps = graph.search(src_ids, GenerationOptions(beam_size=4))    # as runtime/search.py

The variant (`search.onnx`, `search.int8.onnx`, `search.ort`; written by `edgeseq export
--variants ...,search`) is a `com.microsoft.BeamSearch` node around the bundle's encoder
and decoder graphs (docs/bundle.md, "The one-graph search variant"). It runs greedy search
(one beam) and beam search; sampling stays on the Python loop (onnxruntime's `Sampling`
operator refuses encoder–decoders).

The operator ranks finished hypotheses exactly as `beam_search` does (logprob / (tokens +
1) ** length_penalty, `</s>` counted), but scores hypotheses still open at the step budget
with the same length where `beam_search` uses `tokens`. `search` therefore asks for every
beam's hypothesis, rescores each with `normalized_score` and re-ranks them. One difference
remains: the operator keeps at most `num_beams` hypotheses per input, ranked by its own
score, so at the budget it can drop a hypothesis that the loop ranks above one it kept
(`may_differ`). `run` says for which rows that could have happened; `Generator.generate`
with search "auto" then runs that batch on the loop, so its results are the loop's.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from . import constants as C
from .bundle import Bundle
from .config import ModelConfig
from .errors import BundleError, OptionsError
from .graph_variants import SEARCH, open_graph_variant
from .search import (
    GenerationOptions,
    Hypothesis,
    check_source_length,
    normalized_score,
    step_budget,
)

SEARCH_MODES = ("auto", "graph", "loop")  # which path `Generator.generate` takes
# Search "auto" runs an engine batch in the graph only while hypotheses (inputs x beam_size) x
# `step_macs` stays within this. Per decoder step the graph saves the loop's fixed Python cost
# and keeps every row until the whole batch is done (the loop drops finished inputs), so it
# pays off only while a step's compute is small. Measured with benchmarks/graph_vs_loop.py (1
# thread, AVX-512 EPYC, docs/experiments-search.md): g2p-en (6.4 M MACs per hypothesis) graph / loop
# 1.00-1.41x at 1-8 hypotheses, 0.87-0.95x at 16-32, fp32 and int8: the limit is g2p-en's 8
# hypotheses (51.5 M), short of 9 (58 M). random-d512 (26 M MACs; 8,000-token vocabulary,
# 64-token outputs) then takes the graph at 1-2 hypotheses (greedy batch 1-2, measured
# level or ahead) and the loop from beam 4 batch 1 on (vs_ctranslate2.py: graph 0.82x vs
# loop 1.56x of CTranslate2 fp32; graph_vs_loop.py, noisier, 0.97-1.14x).
AUTO_GRAPH_MAX_STEP_MACS = 55_000_000
# On CUDA the graph keeps the whole search on the GPU, and a step's compute costs little there:
# "auto" takes it at every batch size. Measured on an H200 (opus-mt-sized Marian, 128 inputs,
# tokens/s at batch 1 / 32 / 128, docs/gpu.md): graph greedy 600 / 10,661 / 22,308 vs the loop
# 547 / 3,339 / 2,831; beam 4 345 / 2,885 / 3,093 vs 181 / 497 / 223.
GRAPH_EVERYWHERE_DEVICES = ("cuda",)


def step_macs(config: ModelConfig) -> int:
    """Multiply-accumulates of one decoder step for one hypothesis, from the bundle's shape:
    per layer the self-attention's four d_model x (n_heads d_head) projections, the
    cross-attention's query and output projections and the feed-forward's two d_model x
    d_ff; then the output projection over the target vocabulary (attention over the cache
    left out)."""
    d, inner = config.d_model, config.n_heads * config.d_head
    per_layer = 6 * d * inner + 2 * d * config.d_ff
    return config.n_decoder_layers * per_layer + d * config.tgt_vocab_size


def auto_graph_max_hypotheses(config: ModelConfig, device: str = "cpu") -> int | None:
    """The most hypotheses (inputs x beam_size) of an engine batch that search "auto" runs in
    the one-graph variant for a model of `config` on `device` ("cpu" or "cuda"); 0 when it
    never does, None when there is no limit (CUDA)."""
    if device in GRAPH_EVERYWHERE_DEVICES:
        return None
    return AUTO_GRAPH_MAX_STEP_MACS // step_macs(config)


def unsupported_reason(options: GenerationOptions) -> str | None:
    """Why the one-graph variant cannot run `options`, or None when it can."""
    if options.sample:
        return "sampling runs on the Python loop (onnxruntime's Sampling refuses encoder-decoders)"
    if options.target_lang or options.target_prefix:
        return "a target language or prefix is forced on the Python loop (runtime/prefix.py)"
    if options.has_rules:
        return "token rules (bans, forced </s>) run on the Python loop (runtime/rules.py)"
    if options.method == "beam" and options.early_stopping is not True:
        return f"early_stopping {options.early_stopping!r} runs on the Python loop"
    return None


class GraphSearch:
    """A session of the one-graph search variant and the config it was exported with."""

    def __init__(self, session: ort.InferenceSession, config: ModelConfig) -> None:
        self.session, self.config = session, config
        self.max_len, self.max_positions = config.max_len, config.max_positions
        names = {i.name for i in session.get_inputs()}
        missing = [name for name in C.SEARCH_INPUT_NAMES if name not in names]
        if missing:
            raise BundleError(f"the search graph lacks the inputs {missing}; re-export it")

    @classmethod
    def open(
        cls,
        bundle: Bundle,
        precision: str,
        providers: list,
        options: ort.SessionOptions | None = None,
    ) -> GraphSearch | None:
        """The bundle's search graph of `precision` on `providers`, or None when absent."""
        session = open_graph_variant(bundle, SEARCH.key, precision, providers, options)
        return None if session is None else cls(session, bundle.config)

    def feeds(self, src_ids: np.ndarray, options: GenerationOptions) -> dict[str, np.ndarray]:
        """The graph's inputs for src_ids int64 (B, S) right-padded with <pad>."""
        src_ids = np.asarray(src_ids)
        budget = step_budget(self, options.max_new_tokens)

        def scalar(value: float, dtype: type) -> np.ndarray:
            return np.array([value], dtype=dtype)

        return {
            C.SEARCH_INPUT_IDS: np.ascontiguousarray(src_ids, dtype=np.int32),
            C.SEARCH_MAX_LENGTH: scalar(budget + 1, np.int32),
            C.SEARCH_MIN_LENGTH: scalar(0, np.int32),
            C.SEARCH_NUM_BEAMS: scalar(options.beam_size, np.int32),
            C.SEARCH_NUM_RETURN: scalar(options.beam_size, np.int32),
            C.SEARCH_LENGTH_PENALTY: scalar(options.length_penalty, np.float32),
            C.SEARCH_REPETITION_PENALTY: scalar(1.0, np.float32),
            C.SEARCH_ATTENTION_MASK: (src_ids != self.config.pad_id).astype(np.int32),
        }

    def search(self, src_ids: np.ndarray, options: GenerationOptions) -> list[list[Hypothesis]]:
        """Greedy or beam search of src_ids int64 (B, S) in one run -> per row, up to
        options.n_best hypotheses, best first (what `runtime.search.search` returns)."""
        return self.run(src_ids, options)[0]

    def run(
        self, src_ids: np.ndarray, options: GenerationOptions
    ) -> tuple[list[list[Hypothesis]], list[bool]]:
        """`search`'s hypotheses, and per row whether `beam_search` could have returned
        another n-best list (`may_differ`). Unset options take edgeseq's defaults."""
        options = options.filled()
        reason = unsupported_reason(options)
        if reason is not None:
            raise OptionsError(f"the one-graph search cannot run these options: {reason}")
        src_ids = np.asarray(src_ids, dtype=np.int64)
        check_source_length(self, src_ids)
        sequences, scores = self.session.run(
            [C.SEARCH_SEQUENCES, C.SEARCH_SCORES], self.feeds(src_ids, options)
        )
        budget = step_budget(self, options.max_new_tokens)
        ranked, unsure = [], []
        for row_sequences, row_scores in zip(sequences, scores, strict=True):
            hyps = self._ranked(row_sequences, row_scores, budget, options)
            ranked.append(hyps[: options.n_best])
            unsure.append(may_differ(hyps, row_scores, budget, options))
        return ranked, unsure

    def _ranked(
        self,
        sequences: np.ndarray,
        scores: np.ndarray,
        budget: int,
        options: GenerationOptions,
    ) -> list[Hypothesis]:
        """sequences int32 (R, T) (<s> first, </s> left out, -1 after), scores (R,) ->
        Hypotheses scored as `beam_search` scores them, best first."""
        pad, penalty = C.SEARCH_OUTPUT_PAD, options.length_penalty
        hyps = []
        for sequence, score in zip(sequences, scores, strict=True):
            body = sequence[1:]
            ends = np.flatnonzero(body == pad)
            tokens = tuple(int(t) for t in body[: ends[0] if len(ends) else len(body)])
            finished = len(tokens) < budget  # an open hypothesis fills the whole budget
            logprob = float(score) * (len(tokens) + 1) ** penalty
            rescored = normalized_score(logprob, len(tokens) + finished, penalty)
            hyps.append(Hypothesis(tokens, logprob, rescored, finished))
        return sorted(hyps, key=lambda h: -h.score)


def may_differ(
    hyps: list[Hypothesis], scores: np.ndarray, budget: int, options: GenerationOptions
) -> bool:
    """Whether `beam_search` could return another n-best list for a row whose hypotheses
    onnxruntime kept are `hyps` (rescored as the loop scores them) with its own `scores`.

    The operator keeps at most num_beams hypotheses, ranked by its score, in which an open
    hypothesis at the budget is divided by (budget + 1) ** length_penalty where the loop
    divides by budget ** length_penalty. At the budget it can thus drop a finished hypothesis
    (length_penalty > 0) or an open one (< 0) that the loop ranks higher. Whatever it dropped
    scored at most its worst kept score, which is, in the loop's terms, at most `bound`. The
    list is certain when its n_best-th loop score is above that bound, or when nothing could
    have been dropped out of order (greedy, no length penalty, or, with a positive one, no
    open hypothesis kept: no open one then displaced a finished one)."""
    penalty = options.length_penalty
    if options.beam_size == 1 or penalty == 0:
        return False
    if penalty > 0 and all(h.finished for h in hyps):
        return False
    open_factor = ((budget + 1) / budget) ** penalty  # onnxruntime score -> the loop's
    bound = float(np.min(scores)) * min(1.0, open_factor)
    nth = hyps[min(options.n_best, len(hyps)) - 1].score
    return not nth > bound
