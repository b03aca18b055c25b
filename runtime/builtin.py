"""Built-in bundles: exported models shipped inside the package, found by name.

    resolve_bundle("g2p-en")          # .../edgeseq/runtime/models/g2p-en (package data)
    resolve_bundle("bundles/rev")     # a directory that exists is always taken as given
    builtin_bundles()                 # {"g2p-en": Path(...)}

They live in `runtime/models/NAME/` so that a torch-free install (numpy + onnxruntime +
tokenizers) has a model to run right after `pip install edgeseq`, and the loader needs no
second package to find them. `make builtin-model` rebuilds them from `models/` (the
checkpoints) with the repository's own export; each is an ordinary bundle with a manifest.
"""

from __future__ import annotations

from pathlib import Path

from .constants import MANIFEST_FILE
from .errors import BundleError

BUILTIN_DIR = Path(__file__).resolve().parent / "models"


def builtin_bundles() -> dict[str, Path]:
    """{name: directory} of the bundles shipped in the package, sorted by name."""
    if not BUILTIN_DIR.is_dir():
        return {}
    return {
        path.name: path
        for path in sorted(BUILTIN_DIR.iterdir())
        if path.is_dir() and (path / MANIFEST_FILE).is_file()
    }


def resolve_bundle(bundle: str | Path) -> Path:
    """The directory of `bundle`: an existing path wins; otherwise the built-in bundle of
    that name; otherwise BundleError saying what exists and what to do."""
    path = Path(bundle)
    if path.exists():
        return path
    builtins = builtin_bundles()
    if str(bundle) in builtins:
        return builtins[str(bundle)]
    names = ", ".join(builtins) or "none in this install"
    raise BundleError(
        f"{bundle} is neither a bundle directory nor a built-in model ({names}; "
        "`edgeseq models` lists them): pass the directory of an exported bundle "
        "(edgeseq export CHECKPOINT --out DIR)"
    )
