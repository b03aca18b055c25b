"""How to export: the options `edgeseq export` and `edgeseq verify` pass to a kind.

    options = ExportOptions(variants=VariantOptions(("fp32", "int8")), data="pairs.tsv")
    kind_module(cfg.architecture).export(source, "bundles/rev", options)
    held = held_out(source, options)      # the held-out inputs parity and gates run on

Every kind takes the same options (export/kinds/); one that cannot honour an option (a
variant it has no graph for, fused attention it does not have) refuses it with one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .heldout import HeldOut, heldout_from_file, heldout_sources, with_languages
from .limits import LEVEL3_MIN_INPUTS
from .sources import SourceModel
from .variants import VariantOptions

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ExportOptions:
    """Options of an export (and of `verify`, which reads `inputs`, `data` and `progress`)."""

    opset: int | None = None  # None: the exporter's default
    force: bool = False  # replace an existing bundle
    verify: bool = True  # parity levels and gates; False: neither (--no-verify)
    inputs: int = LEVEL3_MIN_INPUTS  # held-out inputs parity and gates run on
    variants: VariantOptions = field(default_factory=VariantOptions)
    fuse: bool = True  # fused attention operators (encoder–decoder); False: standard ONNX
    data: str | Path | None = None  # a file of held-out inputs instead of the task's split
    # parity decodes' step budget (None: the source's generation max_new_tokens, else max_len)
    max_new_tokens: int | None = None
    target_lang: str | None = None  # a multilingual model's default target in the bundle
    progress: Progress | None = None  # called with each progress line

    def say(self, line: str) -> None:
        """Report one progress line (nothing without a `progress` callback)."""
        if self.progress is not None:
            self.progress(line)


def with_parity_budget(options: ExportOptions, source: SourceModel) -> ExportOptions:
    """`options` with the new tokens parity level 3 and the gates decode at most: the caller's
    `max_new_tokens`, else the one the source's generation settings give `edgeseq generate`
    by default (a Hugging Face checkpoint's max_length - 1, e.g. NLLB-200's 199), else None
    (the model's max_len). A model with random weights never emits `</s>`, so every output
    runs to this budget."""
    if options.max_new_tokens is not None or source.generation is None:
        return options
    budget = source.generation.settings.get("max_new_tokens")
    return replace(options, max_new_tokens=budget) if isinstance(budget, int) else options


def held_out(source: SourceModel, options: ExportOptions) -> HeldOut:
    """The held-out inputs of `source`: `options.data`'s, else its task's dev split, else
    random ids (export/heldout.py), laid out with a multilingual model's default languages as
    generate lays them out; a warning about them is reported as a progress line."""
    if options.data is not None:
        held = heldout_from_file(options.data, source.tokenizers, source.model, options.inputs)
    else:
        held = heldout_sources(source.task, source.tokenizers, source.model, options.inputs)
    held = with_languages(held, source.languages, source.tokenizers, source.model)
    if held.warning:
        options.say(f"warning: {held.warning}")
    return held
