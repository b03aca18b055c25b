"""The exported graphs: names, metadata, embedded weights, dynamic shapes (fixture: conftest)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from edgeseq.export.kinds.seq2seq.graphs import export_encoder
from edgeseq.export.kinds.seq2seq.parity import open_engine
from edgeseq.export.onnx_export import MIN_OPSET, ExportError
from edgeseq.export.parity import TOLERANCE_FP32
from edgeseq.runtime import constants as C


def _engine(case):
    return open_engine(case.bundle / C.ENCODER_FILE, case.bundle / C.DECODER_FILE, case.model.cfg)


def test_graph_names_metadata_and_embedded_weights(export_case) -> None:
    cfg = export_case.model.cfg
    layers = cfg.n_decoder_layers
    for file, inputs, outputs in (
        (C.ENCODER_FILE, C.ENCODER_INPUTS, C.encoder_outputs(layers)),
        (C.DECODER_FILE, C.decoder_inputs(layers), (*C.decoder_outputs(layers), *C.TOP_OUTPUTS)),
    ):
        proto = onnx.load(str(export_case.bundle / file), load_external_data=False)
        assert tuple(v.name for v in proto.graph.input) == inputs
        assert tuple(v.name for v in proto.graph.output) == outputs
        assert next(o.version for o in proto.opset_import if o.domain == "") >= MIN_OPSET
        meta = {p.key: p.value for p in proto.metadata_props}
        assert meta["edgeseq.d_model"] == str(cfg.d_model)
        assert meta["edgeseq.tgt_vocab_size"] == str(cfg.tgt_vocab_size)
        assert meta["edgeseq.eos_id"] == str(cfg.eos_id)
        assert meta["edgeseq.tie_output"] == str(cfg.tie_output).lower()
        assert meta["edgeseq.graph"] == file.removesuffix(".onnx")
        assert not any(
            t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer
        )
    files = {p.name for p in export_case.bundle.iterdir()}
    assert files == set(export_case.manifest["files"]) | {C.MANIFEST_FILE}


def test_dynamic_axes_are_symbolic(export_case) -> None:
    io = json.loads((export_case.bundle / C.CONFIG_FILE).read_text())["io"]
    shapes = {v["name"]: v["shape"] for g in io.values() for v in g["inputs"] + g["outputs"]}
    assert shapes[C.SRC_IDS] == [C.BATCH, C.SRC_LEN]
    assert shapes[C.INPUT_IDS] == [C.BATCH, C.NEW_LEN]
    layers = export_case.model.cfg.n_decoder_layers
    for name in C.layer_names(C.PAST_K, layers) + C.layer_names(C.PRESENT_V, layers):
        assert shapes[name][0] == C.BATCH and isinstance(shapes[name][2], str), name
    assert shapes[f"{C.PAST_K}.0"][2] == C.PAST_LEN
    assert shapes[f"{C.CROSS_K}.0"][:3] == [C.BATCH, export_case.model.cfg.n_heads, C.SRC_LEN]
    assert shapes[C.LOGITS] == [C.BATCH, C.NEW_LEN, export_case.model.cfg.tgt_vocab_size]


# (batch, src_len, past_len, new_len); the export used (2, 5, 3, 2).
OTHER_SHAPES = [(1, 1, 0, 1), (1, 6, 0, 4), (5, 11, 2, 1), (4, 3, 7, 3)]


@pytest.mark.parametrize("shape", OTHER_SHAPES, ids=lambda s: "b{}-s{}-p{}-n{}".format(*s))
def test_graphs_run_at_other_shapes(export_case, shape) -> None:
    batch, src_len, past_len, new_len = shape
    model, engine = export_case.model, _engine(export_case)
    rng = np.random.default_rng(1)
    src = rng.integers(4, model.cfg.src_vocab_size, (batch, src_len))
    src[1:, -1] = model.cfg.pad_id  # padded rows when batch > 1
    cfg = model.cfg
    layers = cfg.n_decoder_layers
    memory, *cross = engine.encoder.run(list(C.encoder_outputs(layers)), {C.SRC_IDS: src})
    assert memory.shape == (batch, src_len, cfg.d_model)
    assert len(cross) == 2 * layers
    assert all(t.shape == (batch, cfg.n_heads, src_len, cfg.d_head) for t in cross)
    cache = [
        rng.standard_normal((batch, cfg.n_heads, past_len, cfg.d_head), np.float32)
        for _ in range(2 * layers)
    ]
    names = C.layer_names(C.PAST_K, layers) + C.layer_names(C.PAST_V, layers)
    names += C.layer_names(C.CROSS_K, layers) + C.layer_names(C.CROSS_V, layers)
    feeds = {
        C.INPUT_IDS: rng.integers(4, cfg.tgt_vocab_size, (batch, new_len)),
        **dict(zip(names, cache + cross, strict=True)),
        C.SRC_MASK: src != cfg.pad_id,
    }
    logits, *present = engine.decoder.run(list(C.decoder_outputs(layers)), feeds)
    assert logits.shape == (batch, new_len, cfg.tgt_vocab_size)
    total = (batch, cfg.n_heads, past_len + new_len, cfg.d_head)
    assert len(present) == 2 * layers and all(t.shape == total for t in present)
    tensors = [torch.from_numpy(t) for t in cache + cross]
    kv = [tuple(tensors[i * layers : (i + 1) * layers]) for i in range(4)]
    with torch.no_grad():
        want_logits, want_k, want_v = model.decode_step(
            torch.from_numpy(feeds[C.INPUT_IDS]), *kv, torch.from_numpy(feeds[C.SRC_MASK])
        )
    for expected, got in zip((want_logits, *want_k, *want_v), (logits, *present), strict=True):
        assert np.abs(expected.numpy() - got).max() <= TOLERANCE_FP32


def test_one_step_of_many_tokens_equals_many_steps_of_one(export_case) -> None:
    """The positional offset is the cache length: feeding 5 tokens at once or one by one
    gives the same logits."""
    cfg, engine = export_case.model.cfg, _engine(export_case)
    src = np.array([[5, 6, 7, cfg.eos_id]], dtype=np.int64)
    tokens = np.array([[cfg.bos_id, 4, 9, 4, 8]], dtype=np.int64)
    together, _ = engine.step(engine.start(src), tokens)
    state, apart = engine.start(src), []
    for t in range(tokens.shape[1]):
        logits, state = engine.step(state, tokens[:, t : t + 1])
        apart.append(logits[:, 0])
    assert state.past_len == tokens.shape[1]
    assert np.abs(together[0] - np.stack(apart, axis=1)[0]).max() <= TOLERANCE_FP32


def test_too_old_opset_is_refused(tmp_path, export_model_factory) -> None:
    model, _ = export_model_factory("post-sin-relu")
    with pytest.raises(ExportError, match="opset 17 is too old"):
        export_encoder(model, tmp_path / "encoder.onnx", opset=MIN_OPSET - 1)
    assert not (tmp_path / "encoder.onnx").exists()


def test_exporter_noise_is_silenced_but_replayed_on_failure(capsys) -> None:
    from edgeseq.export.onnx_export import quiet_exporter

    with quiet_exporter():
        print("[torch.onnx] Run decompositions...")
    assert capsys.readouterr().out == ""
    with pytest.raises(RuntimeError, match="unsupported op"), quiet_exporter():
        print("[torch.onnx] Translate the graph into ONNX... ❌")
        raise RuntimeError("unsupported op")
    captured = capsys.readouterr()
    assert "Translate the graph into ONNX... ❌" in captured.err and captured.out == ""
