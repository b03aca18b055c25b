"""Source adapters: where a model enters the export pipeline.

    source = open_source("runs/rev/best")              # the adapter that recognises the path
    source.model, source.tokenizers, source.task       # our module, its vocabularies, its task
    source.reference                                   # the original model, for parity
    detect_adapter("opus-mt-en-de")                    # "marian" (None: no adapter reads it)

An adapter reads one source format and returns a `SourceModel`: a PyTorch module of our
family (build_model: `Seq2SeqTransformer`, `DecoderOnlyTransformer`, `EncoderOnlyTransformer`)
carrying the source's weights, its tokenizers as `tokenizers` objects, and a handle on the
source model itself so that parity compares the graphs with the original, not only with our
re-implementation. Everything after it (graphs, parity, variants, gates, the one-graph
search, the bundle) takes a `SourceModel` and never asks which adapter made it.

Adding a source format is one module in this package with three names, listed in
`ADAPTER_MODULES`:
`NAME` (what `--source` accepts), `detect(path) -> bool` (does this path look like mine?)
and `load(path, **options) -> SourceModel` (refusing, with one line naming the part, what
does not map onto our blocks). The modules are imported only when asked for, so a source
needing an extra (transformers, sentencepiece) costs nothing to the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from edgeseq.runtime.errors import EdgeseqError
from edgeseq.runtime.tokenizer import TokenizerPair

# Adapter name (what `--source` accepts) -> module, in the order `open_source` tries them
# when no adapter is named.
ADAPTER_MODULES = {
    "checkpoint": "checkpoint",
    "torch": "torch_module",
    "marian": "marian",
    "m2m_100": "m2m_100",
    "mbart": "mbart",
    "t5": "t5",
}
ADAPTERS = tuple(ADAPTER_MODULES)


class SourceError(EdgeseqError):
    """A source cannot be read or does not map onto our blocks."""


class SourceReference(Protocol):
    """The source model as parity sees it: its own code and weights, in our token ids."""

    def logits(self, src_ids: Any, tgt_in: Any) -> Any:
        """Full uncached forward: src_ids int64 (B, S) right-padded, ending with `</s>`;
        tgt_in int64 (B, T) starting with `<s>` -> float32 logits (B, T, V)."""
        ...

    def generate(
        self, sources: list[list[int]], beam_size: int, max_new_tokens: int
    ) -> list[list[int]] | None:
        """The source's own generation (ids without `<s>`/`</s>`), or None when it has none
        (parity then decodes greedily with `logits`)."""
        ...

    # Optional: `target_prefix`, a tuple of edgeseq ids the source forces as the first
    # generated tokens (a target language); parity forces them in edgeseq's search too.


@dataclass
class SourceModel:
    """A model ready for export, whichever format it came from."""

    model: Any  # a build_model module of the config's architecture, eval mode, CPU
    tokenizers: TokenizerPair
    task: dict[str, Any] | None  # the edgeseq task it was trained on (held-out inputs), if any
    adapter: str  # the adapter's NAME
    description: str  # one line: what was loaded
    reference: SourceReference | None = None  # None: the model is the source (edgeseq)
    weights: tuple[Path, ...] = ()  # the files its weights were read from (sizes in reports)
    # the model's languages as the bundle records them (docs/bundle.md), None without any
    languages: dict[str, Any] | None = None
    # the source's generation settings, a generation_config.GenerationRecord, None without any
    generation: Any = None
    # task name -> the text put before each input for it (T5's task_specific_params)
    task_prefixes: dict[str, str] | None = None


def adapter_module(name: str) -> ModuleType:
    """The adapter module called `name` (one of ADAPTERS)."""
    if name not in ADAPTERS:
        raise SourceError(f"unknown source format {name!r}; choose one of {', '.join(ADAPTERS)}")
    return importlib.import_module(f"{__name__}.{ADAPTER_MODULES[name]}")


def detect_adapter(path: str | Path) -> str | None:
    """The name of the first adapter in ADAPTERS whose `detect` accepts `path`, else None."""
    return next((name for name in ADAPTERS if adapter_module(name).detect(Path(path))), None)


def open_source(path: str | Path, adapter: str | None = None, **options: Any) -> SourceModel:
    """Load `path` with the adapter called `adapter`, or the first in ADAPTERS whose
    `detect` accepts it (an edgeseq checkpoint when none does, whose loader names what is
    missing)."""
    if adapter is None:
        adapter = detect_adapter(path) or ADAPTERS[0]
    return adapter_module(adapter).load(Path(path), **options)
