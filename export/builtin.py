"""Build a built-in bundle (package data of `edgeseq.runtime`) from a checkpoint.

    python -m edgeseq.export.builtin models/g2p-en runtime/models/g2p-en    # make builtin-model

The checkpoint is exported with the usual `export_checkpoint` (fp32 graphs, the three parity
levels on the task's held-out inputs, the int8 variant behind its accuracy gate); then only
the variants in `keep` stay in the bundle and the manifest is rewritten for the files left.
The parity report of the fp32 graphs stays in the manifest as the evidence the int8 graphs
were gated against; `dropped_variants` says which graphs were exported but not shipped. The
wheel carries int8 only: the fp32 graphs of g2p-en are 53 MB, the int8 ones 14 MB.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeseq.runtime import constants as C
from edgeseq.runtime.atomic import atomic_directory
from edgeseq.runtime.errors import BundleError
from edgeseq.runtime.manifest import write_manifest

from .options import ExportOptions
from .pipeline import export_checkpoint
from .variants import VariantOptions

DEFAULT_KEEP = ("int8",)


def slim_bundle(bundle: Path, keep: Sequence[str]) -> dict[str, Any]:
    """Delete the graphs of every variant of `bundle` not in `keep` and rewrite its manifest
    (files table, variants, `dropped_variants`); return the new manifest."""
    manifest = json.loads((bundle / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    variants = manifest["variants"]
    missing = [name for name in keep if name not in variants]
    if missing:
        raise BundleError(f"{bundle} has no variant {missing[0]!r} to keep; export it first")
    kept_files = {variants[name][g] for name in keep for g in ("encoder", "decoder")}
    dropped = sorted(name for name in variants if name not in keep)
    for name in dropped:
        for graph in ("encoder", "decoder"):
            if variants[name][graph] not in kept_files:
                (bundle / variants[name][graph]).unlink()
    manifest["variants"] = {name: variants[name] for name in keep}
    manifest["dropped_variants"] = dropped
    for key in ("files", "format_version"):
        manifest.pop(key, None)
    return write_manifest(bundle, manifest)


def build_builtin(
    checkpoint: str | Path, out: str | Path, keep: Sequence[str] = DEFAULT_KEEP
) -> dict[str, Any]:
    """Export `checkpoint` with the variants in `keep`, keep only those graphs, and put the
    bundle at `out` (replacing it only when everything succeeded); return the manifest."""
    out = Path(out)
    work = out.parent / f".{out.name}.build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        staged = work / out.name
        names = ("fp32", *(name for name in keep if name != "fp32"))
        # Standard operators: the wheel's bundle must run on every onnxruntime that
        # pyproject.toml accepts (>= 1.18); fused attention needs 1.21 (docs/bundle.md).
        options = ExportOptions(
            force=True, variants=VariantOptions(names), fuse=False, progress=print
        )
        export_checkpoint(checkpoint, staged, options)
        manifest = slim_bundle(staged, keep)
        with atomic_directory(out) as tmp:
            shutil.copytree(staged, tmp, dirs_exist_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of `make builtin-model`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--keep", default=",".join(DEFAULT_KEEP), help="variants to ship")
    args = parser.parse_args(argv)
    manifest = build_builtin(args.checkpoint, args.out, tuple(args.keep.split(",")))
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    print(f"wrote {args.out}: {len(manifest['files'])} files, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
