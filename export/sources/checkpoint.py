"""The edgeseq checkpoint adapter: a directory that `edgeseq train` wrote.

source = load("runs/rev/best")      # SourceModel; reference None: the model is the source
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import SourceModel

NAME = "checkpoint"


def detect(path: Path) -> bool:
    """A directory holding an edgeseq task file next to its weights."""
    from edgeseq.build_model.checkpoint import MODEL_FILE, TASK_FILE

    return (path / TASK_FILE).is_file() and (path / MODEL_FILE).is_file()


def load(path: Path, **options: Any) -> SourceModel:
    """The checkpoint's model (eval mode, CPU), tokenizers and task."""
    from edgeseq.build_model.checkpoint import MODEL_FILE, load_checkpoint

    model, tokenizers, meta = load_checkpoint(path)
    description = f"edgeseq checkpoint {path}"
    return SourceModel(
        model, tokenizers, meta.task, NAME, description, weights=(Path(path) / MODEL_FILE,)
    )
