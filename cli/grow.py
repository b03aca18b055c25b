"""`edgeseq grow CHECKPOINT --out DIR`: a deeper or wider copy of a checkpoint, to train on;
option parsing over build_model/checkpoint.py's `grow_checkpoint` (torch, imported when the
command runs).

    edgeseq grow models/g2p-en --out runs/g2p-44 --encoder-layers 4 --decoder-layers 4
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write.")
@click.option(
    "--encoder-layers",
    type=click.IntRange(min=1),
    help="Encoder layers of the result (at least the checkpoint's; default: the same).",
)
@click.option(
    "--decoder-layers",
    type=click.IntRange(min=1),
    help="Decoder layers of the result (at least the checkpoint's; default: the same).",
)
@click.option(
    "--d-ff",
    type=click.IntRange(min=1),
    help="FFN hidden size of the result (at least the checkpoint's; default: the same).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of new FFN weights.")
def grow(
    checkpoint: Path,
    out: Path,
    encoder_layers: int | None,
    decoder_layers: int | None,
    d_ff: int | None,
    seed: int,
) -> None:
    """Write a deeper and/or wider copy of CHECKPOINT at --out, to train on.

    Deeper (layer stacking): each new layer is a copy of a trained one; 3 -> 6 layers repeats
    every layer once ([0, 0, 1, 1, 2, 2]); 3 -> 4 repeats the lowest ([0, 0, 1, 2]). The
    deeper model scores worse than the original until it is trained. Wider (--d-ff): every
    FFN gets new hidden units whose output weights are zero, so the wider model computes
    exactly what the original did, with room to learn more. Continue with
    `edgeseq train --init-from OUT` and a recipe of the new shape.

    \b
    Examples:
      edgeseq grow models/g2p-en --out runs/g2p-44 --encoder-layers 4 --decoder-layers 4
      edgeseq train --init-from runs/g2p-44 --recipe models/g2p-en/recipes/3-grow-4x4.json \\
        --out runs/g2p-deeper
      edgeseq grow models/g2p-en --out runs/g2p-wide --d-ff 1536
    """
    from edgeseq.build_model.checkpoint import grow_checkpoint, load_checkpoint

    path = grow_checkpoint(checkpoint, out, encoder_layers, decoder_layers, d_ff, seed)
    model, _, meta = load_checkpoint(path)
    layers, widths = meta.train_state["grown_layers"], meta.train_state["grown_d_ff"]
    wider = f", d_ff {widths[0]} -> {widths[1]}" if widths[0] != widths[1] else ""
    click.echo(
        f"grew {checkpoint} -> {path}: encoder layers {layers['encoder']}, "
        f"decoder layers {layers['decoder']}{wider} "
        f"({sum(p.numel() for p in model.parameters()):,} parameters)"
    )
