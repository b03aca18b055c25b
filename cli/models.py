"""`edgeseq models`: the bundles shipped in the package, usable by name.

edgeseq models            # name, task, variants, size, directory
edgeseq generate g2p-en hello
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edgeseq.runtime import constants as C
from edgeseq.runtime.builtin import builtin_bundles


def describe_builtin(name: str, path: Path) -> dict[str, Any]:
    """Name, task, variants, size in bytes and directory of the built-in bundle at `path`."""
    manifest = json.loads((path / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    config = json.loads((path / C.CONFIG_FILE).read_text(encoding="utf-8"))
    task = config.get("task") or {}
    return {
        "name": name,
        "task": task.get("name", "?"),
        "variants": sorted(manifest.get("variants") or {}),
        "bytes": sum(entry["bytes"] for entry in manifest["files"].values()),
        "path": str(path),
    }


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per bundle.")
def models(as_json: bool) -> None:
    """List the built-in bundles: pass a NAME wherever a bundle directory is expected
    (`edgeseq generate g2p-en hello`, `Generator.load("g2p-en")`); a directory of that name
    in the current directory takes precedence."""
    rows = [describe_builtin(name, path) for name, path in builtin_bundles().items()]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, sort_keys=True))
        return
    if not rows:
        click.echo("no built-in bundles in this install")
        return
    for row in rows:
        click.echo(
            f"{row['name']:<10} task {row['task']:<8} {','.join(row['variants']):<10} "
            f"{row['bytes'] / 1e6:5.1f} MB  {row['path']}"
        )
