"""A tied output projection saved in blocks of its table's rows (export/tied_projection.py):
in a graph with a data file, each block is an initializer naming a run of the table's own
bytes (nothing written twice), standard operators only; parity passes on the blocked graphs;
int8 still quantizes the projection (the quantizer sees the joined form); ids equal those of
the same model's single-file bundle.

The tiny tied model of conftest.EXPORT_CONFIGS, with TARGET_SYMBOLS target words so that its
table passes the size up to which the exporter folds the projection's Transpose into a copy
(onnxscript's constant folding, 8,192 elements; every real vocabulary is past it), is
exported with every graph's weights in a data file (EDGESEQ_EXTERNAL_DATA_MB=0) and blocks of
512 bytes, so that its table is split as NLLB-200's 1 GB table is at the default 64 MiB."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx
import pytest
from conftest import make_export_model
from test_external_data import threshold_mb

from edgeseq.export import tied_projection
from edgeseq.export.external_data import load_graph
from edgeseq.export.kinds.seq2seq.bundle import export_bundle
from edgeseq.export.variants import VariantOptions
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.options import GenerationOptions

MODEL = "pre-learned-gelu-tied"
TARGET_SYMBOLS = 220
VARIANTS = ("fp32", "int8", "steps", "inplace")
BLOCKED = ("decoder.onnx", "decoder.steps.onnx", "decoder.inplace.onnx")
SOURCES = ["abc", "hgfedcba", "j", "abcdefghij", "ca", "aaaa"]


@contextmanager
def small_blocks(block_bytes: int = 512) -> Iterator[None]:
    """tied_projection.BLOCK_BYTES set to `block_bytes` inside the block."""
    before = tied_projection.BLOCK_BYTES
    tied_projection.BLOCK_BYTES = block_bytes
    try:
        yield
    finally:
        tied_projection.BLOCK_BYTES = before


def _export(directory: Path) -> dict[str, Any]:
    model, tokenizers = make_export_model(MODEL, tgt_symbols=TARGET_SYMBOLS)
    assert model.cfg.tie_output and model.cfg.tgt_vocab_size * model.cfg.d_model > 8192
    options = VariantOptions(VARIANTS, max_metric_drop=100.0, speed_inputs=2)
    return export_bundle(model, tokenizers, directory, max_new_tokens=12, variants=options)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"blocked": external data and 512-byte blocks, "plain": the single-file bundle}."""
    root = tmp_path_factory.mktemp("tied")
    with threshold_mb("0"), small_blocks():
        _export(root / "blocked")
    _export(root / "plain")
    return {"blocked": root / "blocked", "plain": root / "plain"}


@pytest.mark.parametrize("graph", BLOCKED)
def test_projection_reads_its_table_in_blocks(bundles: dict[str, Path], graph: str) -> None:
    path = bundles["blocked"] / graph
    model = onnx.load(str(path), load_external_data=False)
    marked = [n for n in model.graph.node if n.doc_string.startswith(tied_projection.MARKER)]
    assert len(marked) == 1 and marked[0].op_type == "Concat"
    table_name = marked[0].doc_string[len(tied_projection.MARKER) :]
    inits = {t.name: t for t in model.graph.initializer}
    table = inits[table_name]
    entries = {e.key: e.value for e in table.external_data}
    blocks = [inits[f"{table_name}/rows{i}"] for i in range(len(marked[0].input))]
    assert len(blocks) > 1
    offset = int(entries.get("offset", "0"))
    for block in blocks:  # consecutive runs of the table's bytes, in its own data file
        where = {e.key: e.value for e in block.external_data}
        assert where["location"] == entries["location"] == f"{graph}.data"
        assert int(where["offset"]) == offset and list(block.dims[1:]) == list(table.dims[1:])
        offset += int(where["length"])
    assert offset == int(entries.get("offset", "0")) + int(entries["length"])
    assert sum(b.dims[0] for b in blocks) == table.dims[0]
    assert all(node.domain in ("", "ai.onnx") for node in model.graph.node if node.op_type in (
        "Transpose", "MatMul", "Concat"))  # fmt: skip

    joined = load_graph(path)  # what quantization, float16 and the search graph see
    assert not any(n.doc_string.startswith(tied_projection.MARKER) for n in joined.graph.node)
    assert not any(t.name.startswith(f"{table_name}/rows") for t in joined.graph.initializer)
    turned = [n for n in joined.graph.node if n.op_type == "Transpose" and n.input == [table_name]]
    assert len(turned) == 1
    assert [n.op_type for n in joined.graph.node if turned[0].output[0] in n.input] == ["MatMul"]


def test_split_then_join_is_the_exporters_graph(bundles: dict[str, Path]) -> None:
    def nodes(model: onnx.ModelProto) -> list[tuple[str, ...]]:
        return sorted((n.op_type, n.name, *n.input, "->", *n.output) for n in model.graph.node)

    model = load_graph(bundles["blocked"] / "decoder.onnx")
    inits = sorted(t.name for t in model.graph.initializer)
    for tensor in model.graph.initializer:  # external again, as save_graph leaves them
        if tensor.name.endswith("output.weight") or tensor.name.endswith("tgt_embed.weight"):
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", "x.data"), ("offset", "0"), ("length", "99999")):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
    before = nodes(model)
    with small_blocks():
        assert tied_projection.split_projections(model)
    assert nodes(model) != before
    assert tied_projection.join_projections(model)
    assert nodes(model) == before and sorted(t.name for t in model.graph.initializer) == inits


def test_blocked_bundle_passes_parity_and_int8_quantizes_the_projection(
    bundles: dict[str, Path],
) -> None:
    import json

    manifest = json.loads((bundles["blocked"] / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["parity"]["passed"]
    int8 = onnx.load(str(bundles["blocked"] / "decoder.int8.onnx"), load_external_data=False)
    producer = {out: node for node in int8.graph.node for out in node.output}
    node, seen = producer["logits"], []
    while node.op_type not in ("MatMulInteger", "DynamicQuantizeMatMul", "MatMul"):
        seen.append(node.op_type)
        node = producer[node.input[0]]
    assert node.op_type != "MatMul", seen  # the projection is int8 as in the plain bundle


@pytest.mark.parametrize("variant", ["fp32", "int8"])
@pytest.mark.parametrize("beam", [1, 4])
def test_ids_equal_the_single_file_bundles(bundles: dict[str, Path], variant: str, beam: int):
    options = GenerationOptions(beam_size=beam, max_new_tokens=12)
    results = {
        name: Generator.load(path, variant=variant).generate(SOURCES, options)
        for name, path in bundles.items()
    }
    blocked, plain = results["blocked"], results["plain"]
    assert [r.token_ids for r in blocked] == [r.token_ids for r in plain]
    for a, b in zip(blocked, plain, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-4)
