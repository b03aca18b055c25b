"""A bundle holds no path of the machine that exported it: every file is scanned."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from edgeseq.export.bundle import portable_task
from edgeseq.export.kinds.seq2seq.bundle import export_bundle

REPOSITORY = Path(__file__).resolve().parents[1]


def machine_paths(*extra: Path) -> list[bytes]:
    """Absolute paths of this machine that an exporter could leak into a file."""
    paths = [REPOSITORY, Path(sys.prefix), Path.home(), *extra]
    return sorted({os.fsencode(p.resolve()) for p in paths if len(p.resolve().parts) > 1})


def leaks(bundle: Path, paths: list[bytes]) -> list[str]:
    """'file: path' for every bundle file whose bytes contain one of `paths`."""
    found = []
    for file in sorted(bundle.rglob("*")):
        if file.is_file():
            data = file.read_bytes()
            found += [f"{file.name}: {p.decode()}" for p in paths if p in data]
    return found


def test_portable_task_keeps_only_the_corpus_file_name() -> None:
    task = {"name": "tsv", "options": {"path": "/home/me/data/corpus.tsv", "kind": "char"}}
    assert portable_task(task) == {"name": "tsv", "options": {"path": "corpus.tsv", "kind": "char"}}
    assert task["options"]["path"] == "/home/me/data/corpus.tsv"  # the caller's dict is kept
    assert portable_task({"name": "g2p", "options": {"stress": True}}) == {
        "name": "g2p",
        "options": {"stress": True},
    }
    assert portable_task(None) is None


def test_no_bundle_file_holds_an_absolute_path_of_the_exporter(
    runtime_model, tmp_path: Path
) -> None:
    corpus = tmp_path / "data" / "pairs.tsv"
    corpus.parent.mkdir()
    corpus.write_text("abc\tCBA\n", encoding="utf-8")
    task = {"name": "tsv", "options": {"path": str(corpus.resolve()), "kind": "char"}}
    bundle = tmp_path / "out" / "bundle"
    export_bundle(runtime_model.model, runtime_model.tokenizers, bundle, task=task, verify=False)
    assert leaks(bundle, machine_paths(tmp_path)) == []
    config = json.loads((bundle / "config.json").read_text(encoding="utf-8"))
    assert config["task"]["options"]["path"] == "pairs.tsv"


def test_the_scan_finds_a_planted_path(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps({"p": str(REPOSITORY)}))
    assert leaks(tmp_path / "b", machine_paths()) == [f"config.json: {REPOSITORY.resolve()}"]
