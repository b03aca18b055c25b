"""edgeseq.runtime: load an exported bundle and generate, with numpy + onnxruntime only.

    from edgeseq.runtime import Generator, GenerationOptions
    gen = Generator.load("bundles/rev")                      # providers="auto"
    gen.generate(["abc"], GenerationOptions(beam_size=4))[0].text

This package must never import torch, not even indirectly (tests/test_torch_free.py proves
it). The generation API is imported lazily on first use, so `import edgeseq.runtime.config`
(as training does) does not load onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import ModelConfig
from .errors import EdgeseqError
from .tokenizer import Tokenizer, TokenizerPair

__version__ = "0.1.0"

_LAZY = {
    "Bundle": "bundle",
    "load_bundle": "bundle",
    "Candidate": "generator",
    "Generator": "generator",
    "Result": "generator",
    "GenerationOptions": "search",
    "Hypothesis": "search",
}

__all__ = [
    "Bundle",
    "Candidate",
    "EdgeseqError",
    "GenerationOptions",
    "Generator",
    "Hypothesis",
    "ModelConfig",
    "Result",
    "Tokenizer",
    "TokenizerPair",
    "__version__",
    "load_bundle",
]


def __getattr__(name: str) -> Any:
    """Import the generation API on first access (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
