"""The engines `benchmarks/vs_ctranslate2.py` times: each decodes batches of source ids.

- `SearchEngine`: edgeseq's two-graph loop (`runtime.search` on `OrtStep`) or PyTorch eager
  (the same search on `TorchStep`);
- `GenerateEngine`: `Generator.generate` as a user calls it (texts in, default options but
  the beam and batch size; search "auto", "graph" or "loop"); it records which path each
  call took, so the choice `auto` makes per cell is in the report;
- `Ct2Engine`: CTranslate2's `Translator.translate_batch` on the converted model.

`run(batches, beam)` returns (outputs, tokens) as `harness.measure` expects: the generated
ids of every source (no `<s>`, no `</s>`) in batch order, and the tokens counted for tokens/s
(ids plus one for `</s>`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from harness import Outputs, translate_batches


class SearchEngine:
    """edgeseq's search (`runtime.search`) over a step model: ORT graphs or PyTorch eager
    (`greedy_only`: measured in greedy cells only)."""

    def __init__(self, name: str, step: Any, pad_id: int, greedy_only: bool = False) -> None:
        self.name, self.step, self.pad_id = name, step, pad_id
        self.greedy_only = greedy_only

    def run(self, batches: Sequence[Sequence[list[int]]], beam: int) -> tuple[Outputs, int]:
        """Decode every batch (lists of source ids) -> outputs and generated tokens."""
        from edgeseq.runtime.search import GenerationOptions, search
        from edgeseq.runtime.search_timing import batches as padded

        options = GenerationOptions(beam_size=beam)
        self.hypotheses = []  # the best Hypothesis of each source, kept for `agreement`
        for batch in batches:
            (src_ids,) = padded(batch, len(batch), self.pad_id)
            self.hypotheses += [hyps[0] for hyps in search(self.step, src_ids, options)]
        tokens = sum(len(h.tokens) + h.finished for h in self.hypotheses)
        return [h.tokens for h in self.hypotheses], tokens

    def token_logprobs(self, source: list[int], tokens: Sequence[int]) -> list[float]:
        """Teacher-forced log-probability of each of `tokens` after `source`: one decoder
        step over `<s>` and tokens[:-1]."""
        from edgeseq.runtime.search import log_softmax

        state = self.step.start(np.array([source], dtype=np.int64))
        ids = np.array([[self.step.bos_id, *tokens[:-1]]], dtype=np.int64)
        logits, _ = self.step.step(state, ids)  # (1, N, V)
        logprobs = log_softmax(logits[0])
        return [float(logprobs[t, token]) for t, token in enumerate(tokens)]


class GenerateEngine:
    """`Generator.generate` on texts, as a user calls it. The texts are the source tokenizer's
    decoding of each source's ids; `__init__` checks that they encode back to the same ids,
    so every engine decodes the same inputs."""

    def __init__(self, name: str, generator: Any, sources: Sequence[list[int]]) -> None:
        from edgeseq.runtime.errors import EdgeseqError

        self.name, self.generator = name, generator
        self.paths: dict[tuple[int, int], set[str]] = {}  # (beam, batch) -> paths taken
        tokenizer = generator.tokenizers.source
        self.texts: dict[tuple[int, ...], str] = {}
        for ids in sources:
            text = tokenizer.decode(ids[:-1])
            if tuple(generator.encode(text).ids) != tuple(ids):
                raise EdgeseqError(
                    f"source {ids} does not survive decode/encode through the bundle's "
                    f"tokenizer ({text!r}); {name} cannot be timed on these sources"
                )
            self.texts[tuple(ids)] = text

    def run(self, batches: Sequence[Sequence[list[int]]], beam: int) -> tuple[Outputs, int]:
        """Decode every batch through `generate` -> outputs and generated tokens."""
        from edgeseq.runtime.search import GenerationOptions

        outputs, tokens = [], 0
        for batch in batches:
            # edgeseq's defaults, not a bundle's generation defaults: every engine, one search
            options = GenerationOptions(beam_size=beam, batch_size=len(batch)).filled()
            path = "graph" if self.generator.uses_graph(options, len(batch)) else "loop"
            if path == "loop" and "InPlace" in type(self.generator.loop_model(options)).__name__:
                path = "loop in place"
            self.paths.setdefault((beam, len(batch)), set()).add(path)
            for result in self.generator.generate([self.texts[tuple(s)] for s in batch], options):
                outputs.append(tuple(result.token_ids))
                tokens += len(result.token_ids) + result.finished
        return outputs, tokens


class Ct2Engine:
    """A CTranslate2 Translator of the converted model at one compute type."""

    def __init__(self, name: str, path: Path, compute_type: str, threads: int, cfg: Any) -> None:
        import ctranslate2
        from ct2_convert import ct2_vocabulary

        self.name, self.max_len = name, cfg.max_len
        self.translator = ctranslate2.Translator(
            str(path), device="cpu", compute_type=compute_type, intra_threads=threads
        )
        self.src_vocab = ct2_vocabulary(cfg.src_vocab_size)
        self.tgt_vocab = ct2_vocabulary(cfg.tgt_vocab_size)
        self.tgt_index = {t: i for i, t in enumerate(self.tgt_vocab)}

    def run(self, batches: Sequence[Sequence[list[int]]], beam: int) -> tuple[Outputs, int]:
        """Decode every batch -> outputs and generated tokens (see the module docstring)."""
        return translate_batches(
            self.translator, batches, beam, self.max_len, self.src_vocab, self.tgt_index
        )

    def token_logprobs(self, source: list[int], tokens: Sequence[int]) -> list[float]:
        """Teacher-forced log-probability of each of `tokens` after `source` (Translator
        .score_batch; at most max_len - 1 tokens, as it appends `</s>`)."""
        (scored,) = self.translator.score_batch(
            [[self.src_vocab[i] for i in source]], [[self.tgt_vocab[i] for i in tokens]]
        )
        return list(scored.log_probs[: len(tokens)])
