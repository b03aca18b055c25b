"""Vocabulary fingerprints: refuse a tokenizer file that is not the one the graphs were
exported with, even when it has the same size and special ids (another model's, or the same
tokens re-ordered) and the manifest's checksums were rewritten to match it.

    fingerprint_file("bundle/tokenizer.json")        # 64 hex digits
    check_vocabulary(bundle_dir, manifest, {"source": "tokenizer.json", ...}, graph_paths)

The fingerprint of a tokenizer file (`tokenizers` JSON) is the sha256 of the UTF-8 bytes of
the canonical JSON (RFC 8785, JCS) of the object

    {"vocab": [[id, token], ...],          # every id of model.vocab and added_tokens, by id
     "model": {...},                       # tokenizer.json's "model" without its "vocab"
     "normalizer": ..., "pre_tokenizer": ..., "decoder": ...}   # as in the file (or null)

`vocab` lists each distinct (id, token string) pair of `model.vocab` (an object token -> id,
or for a Unigram model an array of [token, score] whose index is the id) and of
`added_tokens` (`id`, `content`), sorted by id, then by token. In `model`, a Unigram's
[token, score] array becomes the array of its scores and a BPE's "a b" merge strings become
["a", "b"] pairs; every other member stays. The added tokens' flags, `post_processor`,
`truncation` and `padding` are left out (edgeseq adds `</s>` itself). docs/bundle.md states
this for other runtimes; runtime/web/tokenizer.mjs computes the same value.

The exporter writes each side's fingerprint into the graphs' `metadata_props`
(`edgeseq.source_vocab_sha256`, `edgeseq.target_vocab_sha256`) and into manifest.json
(`"vocabulary": {"source": ..., "target": ...}`). Bundles written before have neither, and
load unchecked.
"""

from __future__ import annotations

import hashlib
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

from .errors import BundleError
from .onnx_proto import read_onnx_metadata

SIDES = ("source", "target")
METADATA_KEYS = {side: f"edgeseq.{side}_vocab_sha256" for side in SIDES}
MANIFEST_KEY = "vocabulary"
HEX64 = re.compile(r"[0-9a-f]{64}")


# -- the fingerprint --------------------------------------------------------------------------
def _number(value: float) -> str:
    """`value` as ECMAScript's Number.prototype.toString writes it (RFC 8785, 3.2.2.3)."""
    if value == 0:
        return "0"
    _, digits, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    text, k = "".join(map(str, digits)), len(digits)
    n = exponent + k  # value = 0.text * 10**n
    if k <= n <= 21:
        out = text + "0" * (n - k)
    elif 0 < n <= 21:
        out = f"{text[:n]}.{text[n:]}"
    elif -6 < n <= 0:
        out = "0." + "0" * -n + text
    else:
        mantissa = text if k == 1 else f"{text[0]}.{text[1:]}"
        out = f"{mantissa}e{'+' if n - 1 >= 0 else '-'}{abs(n - 1)}"
    return ("-" if value < 0 else "") + out


def canonical_json(value: Any) -> str:
    """RFC 8785 (JCS) text of a parsed JSON value: keys sorted by UTF-16 code units, no
    whitespace, numbers as ECMAScript writes them, strings escaped as JSON.stringify does."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 2**53 else _number(float(value))
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        members = (f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(value[k])}" for k in keys)
        return "{" + ",".join(members) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def fingerprinted(data: dict[str, Any]) -> dict[str, Any]:
    """The object whose canonical JSON is hashed (see the module docstring)."""
    model = dict(data.get("model") or {})
    vocab = model.pop("vocab", None)
    if isinstance(vocab, dict):
        pairs = {(int(i), str(token)) for token, i in vocab.items()}
    elif isinstance(vocab, list):  # Unigram: [token, score], the index is the id
        pairs = {(i, str(entry[0])) for i, entry in enumerate(vocab)}
        model["vocab"] = [entry[1] for entry in vocab]
    else:
        pairs = set()
    pairs |= {(int(t["id"]), str(t["content"])) for t in data.get("added_tokens") or []}
    if isinstance(model.get("merges"), list):
        model["merges"] = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]
    ordered = sorted(pairs, key=lambda p: (p[0], p[1].encode("utf-16-be")))
    return {
        "vocab": [list(p) for p in ordered],
        "model": model,
        **{key: data.get(key) for key in ("normalizer", "pre_tokenizer", "decoder")},
    }


def fingerprint(data: dict[str, Any]) -> str:
    """Hex sha256 fingerprint of a parsed tokenizer.json."""
    text = canonical_json(fingerprinted(data))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint_file(path: str | Path) -> str:
    """The fingerprint of the tokenizer file at `path`; BundleError if it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return fingerprint(data)
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise BundleError(f"{path} is not a tokenizer file ({exc}); re-export the bundle") from None


def fingerprints(tokenizers: Any) -> dict[str, str]:
    """{"source": hex, "target": hex} of a TokenizerPair, as its saved files will hash."""
    return {side: fingerprint(json.loads(getattr(tokenizers, side).to_str())) for side in SIDES}


def graph_metadata(values: dict[str, str]) -> dict[str, str]:
    """The graphs' metadata_props entries for fingerprints {"source": hex, "target": hex}."""
    return {METADATA_KEYS[side]: value for side, value in values.items()}


# -- reading the recorded fingerprints ------------------------------------------------------
def recorded(
    directory: Path, manifest: dict[str, Any], graphs: list[Path]
) -> dict[str, list[tuple[str, str]]]:
    """{side: [(where, hex), ...]}: every fingerprint recorded in manifest.json and in the
    metadata_props of the .onnx files among `graphs`."""
    found: dict[str, list[tuple[str, str]]] = {side: [] for side in SIDES}
    table = manifest.get(MANIFEST_KEY)
    if table is not None and not isinstance(table, dict):
        raise BundleError(f'{directory}/manifest.json: "vocabulary" is not an object; re-export')
    for side, value in (table or {}).items():
        if side in found:
            found[side].append(("manifest.json", value))
    for graph in graphs:
        if graph.suffix == ".onnx":
            try:
                meta = read_onnx_metadata(graph)
            except BundleError:  # a graph that does not parse: opening it names the file,
                continue  # and a variant that cannot run is the runtime's to refuse or skip
            for side in SIDES:
                if METADATA_KEYS[side] in meta:
                    found[side].append((graph.name, meta[METADATA_KEYS[side]]))
    return found


def check_vocabulary(
    directory: Path, manifest: dict[str, Any], files: dict[str, str], graphs: list[Path]
) -> dict[str, str]:
    """Refuse a tokenizer file whose fingerprint differs from one recorded for its side
    (`files`: {"source": name, "target": name}); return the recorded {side: hex} (empty for
    a bundle exported before fingerprints)."""
    checked: dict[str, str] = {}
    for side, records in recorded(directory, manifest, graphs).items():
        if not records:
            continue
        name = files[side]
        got = fingerprint_file(directory / name)
        for where, want in records:
            if not isinstance(want, str) or not HEX64.fullmatch(want):
                raise BundleError(
                    f"{directory}: {where} records the {side} vocabulary fingerprint as "
                    f"{want!r}, not 64 hex digits; re-export the bundle"
                )
            if want != got:
                raise BundleError(
                    f"{directory / name} does not match the vocabulary the graphs were exported "
                    f"with (fingerprint {got[:16]}..., {where} records {want[:16]}...); "
                    "re-export the bundle or restore the file"
                )
        checked[side] = got
    return checked
