"""`edgeseq verify BUNDLE --checkpoint SOURCE`: re-run a bundle's parity checks against the
PyTorch model it was exported from; click parsing over export/pipeline.py's `verify_bundle`.

    edgeseq verify bundles/rev --checkpoint runs/rev/best     # re-run the three parity levels

The library is imported when the command runs, so `--help` needs neither torch nor onnx.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from edgeseq.export.report import format_parity
from edgeseq.runtime.errors import ParityError

from .options import data_option, inputs_option


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--checkpoint",
    required=True,
    type=click.Path(path_type=Path),
    help="The model the bundle was exported from (a checkpoint, torch_source.json or "
    "Hugging Face directory, as given to export).",
)
@data_option()
@inputs_option("Held-out inputs for parity level 3.")
def verify(bundle: Path, checkpoint: Path, data: Path | None, inputs: int) -> None:
    """Re-run the parity checks of BUNDLE against the PyTorch model it came from."""
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import verify_bundle

    start = time.perf_counter()
    say = lambda text: click.echo(f"[{time.perf_counter() - start:5.1f}s] {text}")  # noqa: E731
    try:
        options = ExportOptions(inputs=inputs, data=data, progress=say)
        report = verify_bundle(bundle, checkpoint, options)
    except ParityError as exc:
        click.echo(format_parity(exc.report))
        raise
    click.echo(format_parity(report))
