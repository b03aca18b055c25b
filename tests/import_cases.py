"""Imported models exported once per test session (conftest.py's `marian_import` and
`torch_import` fixtures), for the tests of everything downstream of an import:
tests/test_import_pipeline.py, tests/test_import_downstream.py and tests/test_edge.py.

- `export_marian(root)`: tests/hf_fixtures.py's tiny MarianMT (SentencePiece Unigram
  vocabulary) trained 150 steps to copy words, so that its outputs depend on the input and end
  with `</s>`, with no generation defaults (greedy); exported by `edgeseq export DIR --data
  data.tsv --variants fp32,int8,fp16,ort,search`: every variant gated on MARIAN_DATA's inputs
  and references.
- `export_torch(root)`: examples/torch_transformer's random `nn.Transformer` model (word
  vocabularies, `max_len` 24), exported by `edgeseq export DIR --data data.txt --variants
  fp32,int8,search`.

Each returns {"source": what export read, "data": the --data file, "bundle", "output": the
export's output}.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TORCH_EXAMPLE = ROOT / "examples" / "torch_transformer"
TORCH_DATA = ["a b c", "h e l l o", "w o r l d", "z y x w", "q"]
MARIAN_VARIANTS = "fp32,int8,fp16,ort,search"
MARIAN_SENTENCES = ["the house is small", ">>deu<< café crème", "Straße naïve façade"]
MARIAN_SENTENCES += ["Hello world, 42!"]  # H is not in the vocabulary: <unk>


def marian_rows() -> list[str]:
    """Held-out rows `input TAB reference` of the copy model: 16 words of its corpus and four
    sentences (a language code, accents, a symbol it does not know), each its own reference."""
    from hf_fixtures import synthetic_corpus

    words = dict.fromkeys(line.split()[0] for line in synthetic_corpus("source", 40, seed=7))
    inputs = [*list(words)[:16], *MARIAN_SENTENCES]
    return [f"{text}\t{text.removeprefix('>>deu<< ')}" for text in inputs]


def export_marian(root: Path) -> dict[str, Any]:
    """The copy-trained MarianMT directory and its bundle (see the module docstring)."""
    from hf_fixtures import build_marian_dir

    # generation_config bans <pad> only (which the graph never outputs): the bundle records no
    # generation defaults, so `edgeseq generate` runs greedy here (their tests:
    # tests/test_generation_defaults.py)
    neutral = {"bad_words_ids": [["<pad>"]]}
    source = build_marian_dir(root / "opus-mt-tiny", copy_steps=150, generation=neutral)
    data = root / "data.tsv"
    data.write_text("\n".join(marian_rows()) + "\n", encoding="utf-8")
    return export_with_data(source, data, root / "bundle", MARIAN_VARIANTS)


def export_torch(root: Path) -> dict[str, Any]:
    """The tutorial-shaped random model and its bundle (see the module docstring)."""
    source = root / "tx"
    subprocess.run(
        [sys.executable, str(TORCH_EXAMPLE / "make_example.py"), str(source)],
        check=True, timeout=120, capture_output=True,
    )  # fmt: skip
    mapping = json.loads((source / "torch_source.json").read_text(encoding="utf-8"))
    mapping["max_len"] = 24  # positions kept: random (never-ending) outputs stay short
    (source / "torch_source.json").write_text(json.dumps(mapping), encoding="utf-8")
    data = root / "data.txt"
    data.write_text("\n".join(TORCH_DATA) + "\n", encoding="utf-8")
    return export_with_data(source, data, root / "bundle", "fp32,int8,search")


def export_with_data(source: Path, data: Path, bundle: Path, variants: str) -> dict[str, Any]:
    """`edgeseq export SOURCE --out BUNDLE --data DATA --variants VARIANTS`, in process."""
    from click.testing import CliRunner

    from edgeseq.cli.main import cli

    args = ["export", str(source), "--out", str(bundle), "--data", str(data)]
    result = CliRunner().invoke(cli, [*args, "--variants", variants])
    assert result.exit_code == 0, result.output
    return {"source": source, "data": data, "bundle": bundle, "output": result.output}
