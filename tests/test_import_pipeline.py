"""An imported model goes through the whole pipeline: `edgeseq export` of a user's
`torch.nn.Transformer` (examples/torch_transformer), parity against the user's own module in
the manifest, torch-free generation equal to the user's model, `verify`, and refusals that
write nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from import_cases import TORCH_DATA

from edgeseq.cli.main import cli

DATA = TORCH_DATA


@pytest.fixture(scope="module")
def torch_case(torch_import: dict[str, Any]) -> dict[str, Any]:
    """The example model (random weights, a short positional table), exported by the CLI
    with held-out inputs from --data (tests/import_cases.py: DATA, fp32, int8 and search)."""
    return torch_import


def test_the_manifest_holds_parity_against_the_users_module(torch_case) -> None:
    manifest = json.loads((torch_case["bundle"] / "manifest.json").read_text(encoding="utf-8"))
    group = manifest["parity"]["source"]
    assert group["passed"] and manifest["parity"]["passed"]
    assert group["level1"]["max_abs_diff"] < 1e-4 and group["level2"]["max_abs_diff"] < 1e-4
    noise = manifest["parity"]["level2"]["torch_cached_vs_uncached"]  # PyTorch's own drift
    for level in ("level1", "level2"):
        assert group[level]["bound"] == pytest.approx(1e-4 + noise)
    assert f"bound: 1e-04 + torch's own cached vs uncached {noise:.1e}" in torch_case["output"]
    assert group["level3"]["greedy"]["identical"] == len(DATA)
    assert "source: logits vs the source model" in torch_case["output"]
    assert manifest["parity"]["level3"]["source"].startswith("data.txt")


def test_generate_is_the_users_greedy_decoding(torch_case) -> None:
    from edgeseq.export.kinds.seq2seq.source_parity import ReferenceStep
    from edgeseq.export.sources import open_source
    from edgeseq.runtime import Generator
    from edgeseq.runtime.padding import right_pad
    from edgeseq.runtime.search import greedy_search

    imported = open_source(torch_case["source"] / "torch_source.json")
    reference = ReferenceStep(imported.reference, imported.model.cfg)
    tokenizer = imported.tokenizers.source
    src = right_pad([[*tokenizer.encode(t), tokenizer.eos_id] for t in DATA], tokenizer.pad_id)
    want = greedy_search(reference, src, imported.model.cfg.max_len)
    results = Generator.load(torch_case["bundle"], providers="cpu").generate(DATA)
    assert [list(r.token_ids) for r in results] == want
    cli_out = CliRunner().invoke(cli, ["generate", str(torch_case["bundle"]), "--json", *DATA])
    rows = [json.loads(line) for line in cli_out.output.splitlines() if line.startswith("{")]
    assert [row["ids"] for row in rows] == want


def test_verify_reruns_parity_against_the_source(torch_case) -> None:
    args = ["verify", str(torch_case["bundle"]), "--checkpoint"]
    args += [str(torch_case["source"] / "torch_source.json"), "--data", str(torch_case["data"])]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "source: identical beam-1 ids" in result.output


def _cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "edgeseq.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"weights": "missing.safetensors"}, "missing.safetensors"),
        ({"transformer": "nope"}, "nope"),
        ({"special_tokens": {"pad": "<pad>", "bos": "<s>", "eos": "<eos>", "unk": "<unk>"}}, "<s>"),
    ],
)
def test_a_bad_source_is_one_line_and_writes_nothing(
    torch_case, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    mapping = json.loads((torch_case["source"] / "torch_source.json").read_text("utf-8"))
    bad = torch_case["source"] / f"bad-{len(list(torch_case['source'].glob('bad-*')))}.json"
    bad.write_text(json.dumps(mapping | change), encoding="utf-8")
    out = tmp_path / "never"
    proc = _cli("export", str(bad), "--out", str(out))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_pickle_is_never_unpickled(torch_case, tmp_path: Path) -> None:
    import pickle

    marker = tmp_path / "unpickled"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"

    class Evil:
        def __reduce__(self) -> tuple:
            return (eval, (payload,))

    weights = tmp_path / "weights.pt"
    weights.write_bytes(pickle.dumps({"w": Evil()}))
    mapping = json.loads((torch_case["source"] / "torch_source.json").read_text("utf-8"))
    mapping["weights"] = str(weights)
    bad = torch_case["source"] / "pickled.json"
    bad.write_text(json.dumps(mapping), encoding="utf-8")
    proc = _cli("export", str(bad), "--out", str(tmp_path / "never"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not marker.exists() and not (tmp_path / "never").exists()


# -- a Hugging Face MarianMT checkpoint --------------------------------------------------------
MARIAN_DATA = ["the house is small\tdas Haus ist klein", "hello world, 42!\tHallo Welt, 42!"]
MARIAN_DATA += [">>deu<< café crème\tKaffee", "3 × 7 = 21?\t3 × 7 = 21?"]


@pytest.fixture(scope="module")
def marian_case(marian_import: dict[str, Any]) -> dict[str, Any]:
    """A tiny MarianMT directory (tests/hf_fixtures.py, trained to copy words) exported by the
    CLI with every variant (tests/import_cases.py)."""
    return marian_import


def test_marian_bundle_reproduces_marian_generate(marian_case) -> None:
    from transformers import MarianMTModel

    from edgeseq.export.sources.marian_tokenizer import to_edgeseq_ids
    from edgeseq.runtime import GenerationOptions, Generator

    manifest = json.loads((marian_case["bundle"] / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["parity"]["source"]["passed"]
    assert "(the source's own generate)" in marian_case["output"]
    texts = [line.split("\t")[0] for line in MARIAN_DATA]
    generator = Generator.load(marian_case["bundle"], providers="cpu", search="loop")
    marian = MarianMTModel.from_pretrained(marian_case["source"]).eval()
    pad = marian.config.pad_token_id
    for beams in (1, 4):
        options = GenerationOptions(beam_size=beams, max_new_tokens=20)
        got = [list(r.token_ids) for r in generator.generate(texts, options)]
        sources = [generator.encode(t).ids for t in texts]
        want = []
        for ids in sources:
            marian_ids = torch_tensor([to_marian(ids, pad)])
            out = marian.generate(
                marian_ids, num_beams=beams, max_new_tokens=20, do_sample=False,
                early_stopping=True, length_penalty=1.0, forced_eos_token_id=None,
            )[0].tolist()  # fmt: skip
            kept = [i for i in out[1:] if i not in (pad, marian.config.eos_token_id)]
            want.append(list(to_edgeseq_ids(kept, pad)))
        assert got == want, beams


def to_marian(ids: tuple[int, ...], pad: int) -> list[int]:
    from edgeseq.export.sources.marian_tokenizer import to_marian_ids

    return [int(i) for i in to_marian_ids(list(ids), pad)]


def torch_tensor(rows: list[list[int]]) -> Any:
    import torch

    return torch.tensor(rows, dtype=torch.int64)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: _edit_config(d, model_type="t5"), "t5"),
        (lambda d: (d / "vocab.json").unlink(), "vocab.json"),
        (lambda d: (d / "model.safetensors").unlink(), "model.safetensors"),
    ],
)
def test_a_bad_marian_directory_is_one_line_and_writes_nothing(
    marian_case, tmp_path: Path, damage: Any, message: str
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(marian_case["source"], copy)
    damage(copy)
    out = tmp_path / "never"
    proc = _cli("export", str(copy), "--source", "marian", "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def _edit_config(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text("utf-8")) | changes), "utf-8")
