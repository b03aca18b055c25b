"""edgeseq.runtime: load an exported bundle and generate, with numpy + onnxruntime only.

This package must never import torch, not even indirectly (a test proves it).
"""

from .config import ModelConfig
from .errors import EdgeseqError
from .tokenizer import Tokenizer, TokenizerPair

__version__ = "0.1.0"

__all__ = ["EdgeseqError", "ModelConfig", "Tokenizer", "TokenizerPair", "__version__"]
