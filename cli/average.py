"""`edgeseq average CHECKPOINTS --out DIR`: average checkpoints' weights into one; option parsing
over build_model/checkpoint.py's `average_checkpoints` (torch, imported when the command runs).

    edgeseq average runs/g2p/epochs/* --out runs/g2p/averaged
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write.")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16"]),
    default="float32",
    show_default=True,
    help="Storage type of the averaged weights: float16 halves model.safetensors (to ship a "
    "model under a size budget); every command loads them back as float32.",
)
def average(checkpoints: tuple[Path, ...], out: Path, dtype: str) -> None:
    """Average the weights of CHECKPOINTS (one run's) into a new checkpoint at --out.

    Averaging the last few epochs' weights, as the Transformer paper did, usually scores better
    than any one of them. `edgeseq train` keeps the last `keep_epochs` epochs of a run
    (a recipe field) under OUT/epochs/ for this.

    With one checkpoint and --dtype float16 it writes a half-size copy of its weights.

    \b
    Example:
      edgeseq average runs/g2p/epochs/* --out runs/g2p/averaged
      edgeseq evaluate runs/g2p/averaged --split dev
      edgeseq average runs/g2p/epochs/040 --out runs/g2p/ship --dtype float16
    """
    from edgeseq.build_model.checkpoint import average_checkpoints

    path = average_checkpoints(list(checkpoints), out, weights_dtype=dtype)
    stored = "" if dtype == "float32" else f" (weights stored as {dtype})"
    count = f"{len(checkpoints)} checkpoint{'s' if len(checkpoints) > 1 else ''}"
    click.echo(f"averaged {count} -> {path}{stored}")
