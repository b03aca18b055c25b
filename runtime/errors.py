"""Typed errors. Every mistake a user can make raises a subclass of `EdgeseqError`
whose message says what went wrong and what to do; the CLI prints it on one line."""

from __future__ import annotations


class EdgeseqError(Exception):
    """Base class of every user-facing edgeseq error."""


class ConfigError(EdgeseqError, ValueError):
    """A model configuration is invalid; the message lists every problem."""


class TokenizerError(EdgeseqError):
    """A tokenizer file is missing, unreadable or lacks the special tokens."""


class DataError(EdgeseqError):
    """A task or corpus cannot be read (missing file, malformed line, unknown task)."""


class CheckpointError(EdgeseqError):
    """A checkpoint directory is missing, incomplete or inconsistent."""


class BundleError(EdgeseqError):
    """A bundle is missing a file, was tampered with, or was written by a newer edgeseq."""


class InputTooLongError(EdgeseqError, ValueError):
    """An input (or a generation) needs more positions than the model's `max_len`."""


class ProviderError(EdgeseqError):
    """An execution provider was asked for but cannot be used on this machine."""


class OptionsError(EdgeseqError, ValueError):
    """Generation options are impossible (e.g. top_p outside (0, 1])."""


class ParityError(EdgeseqError):
    """The exported graphs do not compute what PyTorch computes; carries the report."""

    def __init__(self, message: str, report: dict | None = None) -> None:
        super().__init__(message)
        self.report = report or {}


class MissingDependencyError(EdgeseqError):
    """A command needs an optional dependency (torch, onnx) that is not installed."""


class InputFileError(EdgeseqError):
    """An input file that is missing, a directory or unreadable."""


class OutputPathError(EdgeseqError):
    """An output path that cannot be written (below a file, read-only, no permission)."""


class CacheFullError(InputTooLongError):
    """A decoder step would write past the end of the self-attention cache (position >=
    max_len)."""
