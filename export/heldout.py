"""Held-out inputs for parity level 3: the checkpoint's task (dev, then test split) or random.

held = heldout_sources(meta.task, tokenizers, model, n=200)
held.sources[0]      # [12, 7, 9, 2]: source ids ending with </s>
held.texts[0]        # "abc" (None for random sources)
held.description     # "task reverse, dev split (200 of 1000)"
held.references[0]   # ["cba"]: every target of that source in its split (None when random)
held = heldout_from_file("pairs.tsv", tokenizers, model)   # the user's data (--data)
held = with_languages(held, languages, tokenizers, model)  # a multilingual model's layout
held.target_prefix   # (id of the default target language,): forced first, as generate does
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime.errors import EdgeseqError, InputFileError
from edgeseq.runtime.languages import Languages
from edgeseq.runtime.tokenizer import TokenizerPair

from .limits import LEVEL3_MIN_INPUTS
from .parity import random_sources


@dataclass
class HeldOut:
    """Source id lists for level 3, their texts when known, and where they came from."""

    sources: list[list[int]]
    texts: list[str] | None
    description: str
    warning: str | None = None  # why the task's own inputs could not be used
    references: list[list[str]] | None = None  # acceptable targets per source (task only)
    task_name: str | None = None  # the task the sources come from
    target_chars: bool = False  # targets are scored per character (else per word/phoneme)
    target_prefix: tuple[int, ...] = ()  # ids forced as the first generated tokens (a language)


def heldout_sources(
    task: dict[str, Any] | None,
    tokenizers: TokenizerPair,
    model: Seq2SeqTransformer,
    n: int = LEVEL3_MIN_INPUTS,
    seed: int = 0,
) -> HeldOut:
    """Up to `n` distinct sources of the task's dev split (topped up from test) that fit
    `max_len`; random sources when there is no task or it cannot be loaded."""
    if not task:
        return HeldOut(random_sources(model, n, seed), None, "random sources (no task)")
    from edgeseq.build_model.tasks import load_task  # torch-free, but loads data: import late

    name = task.get("name", "?")
    try:
        loaded = load_task(name, **task.get("options", {}))
    except EdgeseqError as exc:
        warning = f"task {name} cannot be loaded ({exc}); parity level 3 uses random sources"
        return HeldOut(random_sources(model, n, seed), None, "random sources", warning)
    cfg, eos = model.cfg, tokenizers.source.eos_id
    sources, texts, references, used = [], [], [], []
    seen: set[str] = set()
    for split in ("dev", "test"):
        taken = 0
        split_refs = loaded.references(split)
        for text, _ in loaded.split(split):
            if len(sources) == n:
                break
            ids = [*tokenizers.source.encode(text), eos]
            if text in seen or len(ids) > cfg.max_len:
                continue
            seen.add(text)
            sources.append(ids)
            texts.append(text)
            references.append(split_refs[text])
            taken += 1
        if taken:
            used.append(f"{split} {taken}")
    if not sources:
        warning = f"task {name} has no dev/test source within max_len; using random sources"
        return HeldOut(random_sources(model, n, seed), None, "random sources", warning)
    description = f"task {name}: {', '.join(used)}"
    return HeldOut(
        sources, texts, description, None, references, name, loaded.target_tokens_are_chars
    )


def heldout_from_file(
    path: str | Path, tokenizers: TokenizerPair, model: Seq2SeqTransformer, n: int = 200
) -> HeldOut:
    """The first `n` distinct sources of a UTF-8 file that fit `max_len`: one input per
    line, optionally followed by a tab and its reference (more tabs: more references). With
    references the variants' gates score word error rate against them, without they measure
    agreement with fp32."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read --data {path}: {exc}") from None
    rows = [line.split("\t") for line in lines if line.strip()]
    with_refs = bool(rows) and all(len(r) > 1 for r in rows)
    cfg, eos = model.cfg, tokenizers.source.eos_id
    bos = [tokenizers.source.bos_id] if cfg.source_bos else []  # BART: <s> tokens </s>
    sources, texts, references, seen = [], [], [], set()
    for source, *refs in rows:
        ids = [*bos, *tokenizers.source.encode(source), eos]
        if source in seen or len(ids) > cfg.max_len or len(ids) == len(bos) + 1:
            continue
        seen.add(source)
        sources.append(ids)
        texts.append(source)
        references.append(refs)
        if len(sources) == n:
            break
    if not sources:
        raise InputFileError(
            f"--data {path} has no input within the model's max_len ({cfg.max_len} tokens); "
            "pass a file with one input per line (input TAB reference, optionally)"
        )
    description = f"{path.name}: {len(sources)} inputs"
    refs_out = references if with_refs else None
    return HeldOut(sources, texts, description, None, refs_out, "data" if with_refs else None)


def with_languages(
    held: HeldOut,
    languages: dict[str, Any] | None,
    tokenizers: TokenizerPair,
    model: Seq2SeqTransformer,
) -> HeldOut:
    """`held` laid out as `edgeseq generate` lays out a multilingual model's inputs with its
    default languages (runtime/languages.py): the source language's token before each
    source's tokens (after `<s>` for a source_bos model) and the default target language
    forced as the first generated token. Sources that no longer fit max_len are dropped;
    `held` itself when `languages` is None (config.json's "languages" object)."""
    langs = Languages.from_config(languages, tokenizers.target)
    if langs is None:
        return held
    prefix = langs.source_prefix_ids(None)
    skip = 1 if model.cfg.source_bos else 0
    laid_out = [[*ids[:skip], *prefix, *ids[skip:]] for ids in held.sources]
    keep = [i for i, ids in enumerate(laid_out) if len(ids) <= model.cfg.max_len]
    if not keep:
        raise InputFileError(
            f"{held.description}: no input fits the model's max_len ({model.cfg.max_len} "
            "tokens) with the source-language token; pass shorter inputs"
        )
    return replace(
        held,
        sources=[laid_out[i] for i in keep],
        texts=None if held.texts is None else [held.texts[i] for i in keep],
        references=None if held.references is None else [held.references[i] for i in keep],
        target_prefix=langs.target_prefix(None),
    )
