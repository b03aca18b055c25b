"""Draw the loss curve of a training lineage: several runs, each `--init-from` the last one's
weights, whose log records were concatenated into one log.jsonl.

    python scripts/plot_lineage.py models/g2p-en/log.jsonl models/g2p-en/loss.png

A `start` record that is not a resume begins a new run, whose steps count from 0 again; the
plot lays the runs end to end on one step axis, marks where each begins with its depth, and
draws train cross-entropy per logged step, dev loss and dev WER per evaluation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def lineage_points(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Split `records` into plot series on one step axis: `train` (step, nll), `dev_loss`,
    `dev_wer` (step, value) and `runs` (first step, encoder layers) of every run."""
    series: dict[str, list[tuple[int, float]]] = {"train": [], "dev_loss": [], "dev_wer": []}
    runs: list[tuple[int, float]] = []
    offset = last = 0
    for r in records:
        event = r.get("event")
        if event == "start" and not r.get("resume"):
            offset = last
            runs.append((offset, r["recipe"]["n_encoder_layers"]))
        if "step" not in r:
            continue
        step = offset + r["step"]
        last = max(last, step)
        if event == "step":
            series["train"].append((step, r.get("nll", r.get("loss"))))
        elif event == "eval":
            series["dev_loss"].append((step, r["dev_loss"]))
            if "wer" in r:
                series["dev_wer"].append((step, 100 * r["wer"]))
    series["runs"] = runs
    return series


def plot(log: Path, png: Path) -> None:
    """Write the lineage plot of `log` (one JSON record a line) to `png`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]
    s = lineage_points(records)
    fig, (ax, ax_wer) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax.plot(*zip(*s["train"], strict=True), lw=0.6, label="train cross-entropy (dropout on)")
    ax.plot(*zip(*s["dev_loss"], strict=True), marker=".", lw=1, label="dev loss")
    ax.set_ylabel("cross-entropy per token")
    ax.set_ylim(0.1, 0.6)
    ax.legend(loc="lower left")
    ax_wer.plot(*zip(*s["dev_wer"], strict=True), marker=".", lw=1, color="C2")
    ax_wer.set_ylabel("dev WER % (first 1,000 words)")
    ax_wer.set_ylim(25, 45)
    ax_wer.set_xlabel("training step, runs laid end to end")
    for start, layers in s["runs"]:
        for a in (ax, ax_wer):
            a.axvline(start, color="grey", lw=0.5, ls="--")
        ax.text(start, 0.58, f" {layers}+{layers}", fontsize=8, va="top")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def main() -> None:
    """Command line: LOG PNG."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="log.jsonl of the whole lineage")
    parser.add_argument("png", type=Path, help="where to write the plot")
    args = parser.parse_args()
    plot(args.log, args.png)


if __name__ == "__main__":
    main()
