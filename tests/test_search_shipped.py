"""Issue 27's acceptance on the shipped model: the one-graph search variant of models/g2p-en
gives the Python loop's best hypotheses on 200 test words, at beam 1 and 4, one word at a
time and in right-padded batches of 32 (fp32). Exporting and comparing take a few minutes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

MODEL = Path(__file__).parents[1] / "models" / "g2p-en"
WORDS = 200


@pytest.fixture(scope="session")
def shipped_search(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """models/g2p-en's graphs and search variant (exported once), and 200 test words."""
    from edgeseq.build_model.checkpoint import load_checkpoint
    from edgeseq.build_model.tasks import load_task
    from edgeseq.export.kinds.seq2seq.graphs import export_decoder, export_encoder
    from edgeseq.export.kinds.seq2seq.search_graph import write_search_graph

    model, tokenizers, meta = load_checkpoint(MODEL)
    out = tmp_path_factory.mktemp("g2p-search")
    export_encoder(model, out / "encoder.onnx")
    export_decoder(model, out / "decoder.onnx")
    info = write_search_graph(out / "encoder.onnx", out / "decoder.onnx", model.cfg, out / "s.onnx")
    task = load_task(meta.task["name"], **meta.task.get("options", {}))
    words = sorted({text for text, _ in task.split("test")})[:WORDS]
    eos = tokenizers.source.eos_id
    sources = [[*tokenizers.source.encode(w), eos] for w in words]
    return {"dir": out, "cfg": model.cfg, "sources": sources, "info": info}


def test_shipped_search_graph_equals_the_loop_on_200_test_words(shipped_search) -> None:
    from edgeseq.export.kinds.seq2seq.parity import open_engine
    from edgeseq.export.kinds.seq2seq.search_parity import compare, open_graph

    out, cfg, sources = shipped_search["dir"], shipped_search["cfg"], shipped_search["sources"]
    assert len(sources) == WORDS and len({len(s) for s in sources}) > 5  # mixed lengths
    loop = open_engine(out / "encoder.onnx", out / "decoder.onnx", cfg)
    rows, _ = compare(loop, open_graph(out / "s.onnx", cfg), sources, cfg.max_len)
    table = {(r["beam_size"], r["batch"]): (r["identical"], r["mismatches"]) for r in rows}
    assert set(table) == {(1, 1), (1, 32), (4, 1), (4, 32)}
    for case, (identical, mismatches) in table.items():
        assert identical == WORDS, (case, mismatches)


def test_shipped_search_graph_stores_every_weight_once(shipped_search) -> None:
    info, out = shipped_search["info"], shipped_search["dir"]
    graphs = sum((out / name).stat().st_size for name in ("encoder.onnx", "decoder.onnx"))
    assert info.shared_initializers >= 1  # the two sinusoidal tables are one
    assert info.bytes < graphs  # no weight twice: smaller than the two graphs together
