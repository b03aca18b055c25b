"""`manifest.json`: what a bundle contains and the evidence it carries.

Written by the exporter (``write_manifest``), checked by the runtime (``check_files``)::

    {
      "format_version": 2,                 # BUNDLE_FORMAT_VERSION of the writer
      "edgeseq_version": "0.1.0",
      "created_utc": "2026-11-21T23:59:00Z",
      "min_onnxruntime": "1.17.0",         # oldest onnxruntime that can run the graphs
      "opset": 20, "ir_version": 10,
      "exporter": {"torch": "...", "onnx": "...", "onnxscript": "...", "onnxruntime": "..."},
      "files": {"encoder.onnx": {"sha256": "…", "bytes": 123}, ...},   # every file but this one
      "variants": {"fp32": {"encoder": "encoder.onnx", "decoder": "decoder.onnx",
                            "verified": true, ...}},
      "parity": {...}                      # the report measured at export
    }
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePath
from typing import Any

from .constants import BUNDLE_FORMAT_VERSION, MANIFEST_FILE
from .errors import BundleError

CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def files_table(directory: str | Path) -> dict[str, dict[str, Any]]:
    """{name: {"sha256", "bytes"}} of every regular file in `directory` but the manifest."""
    directory = Path(directory)
    table = {}
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if path.is_file() and name != MANIFEST_FILE:
            table[name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return table


def write_manifest(directory: str | Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Add the files table and format version to `manifest` and write it; return it."""
    directory = Path(directory)
    full = dict(manifest, format_version=BUNDLE_FORMAT_VERSION, files=files_table(directory))
    text = json.dumps(full, indent=2, sort_keys=True) + "\n"
    (directory / MANIFEST_FILE).write_text(text, encoding="utf-8")
    return full


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Parse `manifest.json`; refuse a missing or unreadable one, or one of another format."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise BundleError(f"{path} is missing: {directory} is not an edgeseq bundle (re-export it)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); re-export the bundle") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{path} is not a JSON object; re-export the bundle")
    for key in ("files", "variants"):
        if not isinstance(manifest.get(key, {}), dict):
            raise BundleError(f'{path}: "{key}" is not a JSON object; re-export the bundle')
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > BUNDLE_FORMAT_VERSION:
        raise BundleError(
            f"{path} has format version {version!r}, this edgeseq reads up to "
            f"{BUNDLE_FORMAT_VERSION}: upgrade edgeseq (pip install -U edgeseq)"
        )
    if version < BUNDLE_FORMAT_VERSION:
        raise BundleError(
            f"{path} has format version {version}, whose graphs take the K/V of all decoder "
            f"layers stacked in one tensor; this edgeseq reads format {BUNDLE_FORMAT_VERSION} "
            "(one tensor per layer): re-export it from its checkpoint with "
            "`edgeseq export CHECKPOINT --out DIR`"
        )
    return manifest


def check_inside(directory: str | Path, name: object) -> Path:
    """The path of bundle file `name`; BundleError unless it is a relative path that stays
    inside `directory` once links are resolved (a bundle is closed: no `../x`, no absolute
    path, no link to a file elsewhere)."""
    directory = Path(directory)
    root = directory.resolve()
    ok = isinstance(name, str) and name and not PurePath(name).is_absolute()
    path = directory / name if ok else directory
    if not ok or ".." in PurePath(name).parts or not path.resolve().is_relative_to(root):
        raise BundleError(
            f"{directory / MANIFEST_FILE} names {name!r}, which is outside the bundle "
            "directory; a bundle only uses its own files: re-export it or copy it whole"
        )
    return path


def file_status(directory: str | Path, name: str, entry: dict[str, Any]) -> str:
    """ "ok", "MISSING" or "TAMPERED": file `name` of the bundle against its manifest entry."""
    path = Path(directory) / name
    if not path.is_file():
        return "MISSING"
    return "ok" if sha256_file(path) == entry.get("sha256") else "TAMPERED"


def check_files(
    directory: str | Path, manifest: dict[str, Any], names: list[str] | None = None
) -> None:
    """Verify the sha256 of `names` (default: every file listed); raise BundleError naming
    the first missing or tampered file."""
    directory = Path(directory)
    table = manifest.get("files", {})
    for name in names if names is not None else sorted(table):
        entry = table.get(name)
        path = check_inside(directory, name)
        if entry is None:
            raise BundleError(f"{name} is not listed in {directory / MANIFEST_FILE}; re-export")
        status = file_status(directory, name, entry)
        if status == "MISSING":
            raise BundleError(f"{path} is missing from the bundle; re-export or copy it again")
        if status == "TAMPERED":
            raise BundleError(
                f"{path} does not match its sha256 in the manifest (tampered or corrupted); "
                "re-export or copy the bundle again"
            )
