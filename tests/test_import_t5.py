"""Importing Hugging Face T5 checkpoints (export/sources/t5.py), v1.0 (ReLU, tied output
scaled by d_model^-0.5) and v1.1 / Flan-T5 (gated GELU, own lm_head): logits, cached steps and
the source's own greedy and beam-4 generate, the tokenizer's ids, the bundle through the CLI
and the API, mT5's model_type, and what the adapter refuses (one `error:` line, exit 1,
nothing at --out)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

pytest.importorskip("transformers", reason="the T5 importer needs the hf extra")
pytest.importorskip("sentencepiece", reason="the test trains a SentencePiece model")

from click.testing import CliRunner
from hf_fixtures import synthetic_corpus
from safetensors.torch import load_file
from t5_fixtures import EXTRA_ROWS, TASK_PARAMS, build_t5_dir
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, T5Tokenizer

from edgeseq.build_model.torch_step import TorchStep
from edgeseq.cli.main import cli, main
from edgeseq.export.sources import SourceError, detect_adapter
from edgeseq.export.sources.marian import SUPPRESSED
from edgeseq.export.sources.t5 import load, to_edgeseq
from edgeseq.runtime import constants as C
from edgeseq.runtime.generator import Generator
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import GenerationOptions, beam_search, greedy_search
from edgeseq.runtime.serve.live_batch import LiveBatch, StepsDecoder

MAX_NEW = 20
TEXTS = ["Straße naïve façade", "the quick brown fox", "λόγος", "Hello world, 42!"]
VERSIONS = ("1.0", "1.1")


@pytest.fixture(scope="module")
def t5_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("t5")
    return {v: build_t5_dir(root / f"t5-v{v}", version=v, copy_steps=150) for v in VERSIONS}


@pytest.fixture(scope="module")
def sources(t5_dirs: dict[str, Path]) -> dict[str, Any]:
    return {v: load(path) for v, path in t5_dirs.items()}


@pytest.fixture(scope="module")
def bundle(t5_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("t5") / "bundle"
    args = ["export", str(t5_dirs["1.1"]), "--out", str(out), "--inputs", "60"]  # module < 90 s
    args += ["--variants", "fp32,steps,inplace,search"]  # fused, with the relative bias
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return out


def inputs(source: Any) -> list[list[int]]:
    """24 corpus words and TEXTS as sources `tokens </s>`, edgeseq ids."""
    words = dict.fromkeys(line.split()[0] for line in synthetic_corpus("source", 60, seed=7))
    return [[*source.tokenizers.source.encode(t), 2] for t in [*list(words)[:24], *TEXTS]]


@pytest.mark.parametrize("version", VERSIONS)
def test_config_and_weight_map(t5_dirs: dict[str, Path], sources: dict, version: str) -> None:
    path, source = t5_dirs[version], sources[version]
    assert detect_adapter(path) == "t5" and source.adapter == "t5"
    cfg, hf = source.model.cfg, json.loads((path / "config.json").read_text())
    assert cfg.tgt_vocab_size == hf["vocab_size"] + 1  # + edgeseq's <s>
    assert (cfg.positional, cfg.norm, cfg.norm_type, cfg.scale_embedding) == (
        "relative", "pre", "rms", False,
    )  # fmt: skip
    assert (cfg.relative_buckets, cfg.relative_max_distance) == (
        hf["relative_attention_num_buckets"], hf["relative_attention_max_distance"],
    )  # fmt: skip
    assert cfg.d_head == hf["d_kv"] and cfg.head_dim == (hf["d_kv"] if version == "1.1" else None)
    assert (cfg.ffn, cfg.activation) == (
        ("gated", "gelu-tanh") if version == "1.1" else ("plain", "relu")
    )
    state, model = load_file(str(path / "model.safetensors")), source.model
    shared = state["shared.weight"]
    assert torch.equal(model.src_embed.weight[0], shared[0])
    assert torch.equal(model.tgt_embed.weight[1], shared[0])  # <s> embeds <pad>: T5's start
    assert torch.equal(model.src_embed.weight[2:], shared[1:])  # </s> 1 -> 2, s -> s + 1
    q = state["encoder.block.1.layer.0.SelfAttention.q.weight"]
    assert torch.allclose(model.encoder_layers[1].self_attn.w_q.weight, q * math.sqrt(cfg.d_head))
    if version == "1.0":  # tied, the output scaled by d_model^-0.5
        assert "lm_head.weight" not in state
        assert torch.allclose(model.output.weight[2:], shared[1:] * cfg.d_model**-0.5)
    else:
        assert not torch.equal(state["lm_head.weight"], shared)
        assert torch.equal(model.output.weight[2:], state["lm_head.weight"][1:])
    assert model.output.bias[1] == SUPPRESSED and not model.output.bias[2:].any()
    assert source.tokenizers.source.vocab_size == cfg.tgt_vocab_size
    assert f"{EXTRA_ROWS} embedding rows without a token" in source.description
    assert "ids equal to transformers' on 7/7" in source.description


@pytest.mark.parametrize("version", VERSIONS)
def test_logits_and_cached_steps_equal_the_source(sources: dict, version: str) -> None:
    """Levels 1 and 2 against T5ForConditionalGeneration itself."""
    source, rng = sources[version], np.random.default_rng(0)
    src = right_pad(inputs(source)[:8], 0)
    tgt = right_pad([[1, *rng.integers(4, 400, n).tolist()] for n in (5, 1, 8, 3) * 2], 0)
    want = source.reference.logits(src, tgt).numpy()
    model = source.model
    with torch.no_grad():
        full = model(torch.as_tensor(src), torch.as_tensor(tgt)).numpy()
        step, steps = TorchStep(model), []
        state = step.start(src)
        for t in range(tgt.shape[1]):
            logits, state = step.step(state, tgt[:, t : t + 1])
            steps.append(logits[:, 0])
    real = tgt != 0
    assert np.abs(full[real] - want[real]).max() < 1e-4
    assert np.abs(np.stack(steps, axis=1)[real] - want[real]).max() < 1e-4


@pytest.mark.parametrize("version", VERSIONS)
def test_greedy_and_beam_equal_the_sources_generate(sources: dict, version: str) -> None:
    """Level 3: the source's own generate (decoder start `<pad>`) vs edgeseq's search."""
    source = sources[version]
    ids = inputs(source)
    step, src = TorchStep(source.model), right_pad(ids, 0)
    greedy = greedy_search(step, src, MAX_NEW)
    beam = [list(h[0].tokens) for h in beam_search(step, src, 4, MAX_NEW)]
    assert source.reference.generate(ids, 1, MAX_NEW) == greedy
    assert source.reference.generate(ids, 4, MAX_NEW) == beam
    assert len({len(row) for row in greedy + beam}) > 3 and greedy != beam


def test_tokenizer_gives_the_sources_ids(t5_dirs: dict[str, Path], sources: dict) -> None:
    hf = AutoTokenizer.from_pretrained(t5_dirs["1.0"])
    assert isinstance(hf, T5Tokenizer)
    ours = sources["1.0"].tokenizers.source
    lines = [*synthetic_corpus("target", 2000, seed=3), "a literal </s> and <extra_id_3>"]
    shift = [[i + 1 if i else 0 for i in row] for row in hf(lines).input_ids]
    assert [[*ours.encode(text), 2] for text in lines] == shift
    assert [ours.decode(row) for row in shift[:50]] == hf.batch_decode(
        hf(lines[:50]).input_ids, skip_special_tokens=True
    )


def test_bundle_generates_the_sources_text(bundle: Path, t5_dirs: dict[str, Path]) -> None:
    config = json.loads((bundle / C.CONFIG_FILE).read_text())["model"]
    assert (config["positional"], config["ffn"], config["relative_buckets"]) == (
        "relative", "gated", 8,
    )  # fmt: skip
    files = {  # fused attention with the relative position bias as attention_bias
        C.ENCODER_FILE: "MultiHeadAttention", C.DECODER_FILE: "MultiHeadAttention",
        C.STEPS_FILES["fp32"]: "MultiHeadAttention",
        C.IN_PLACE_FILES["fp32"]: "DecoderMaskedMultiHeadAttention",
    }  # fmt: skip
    for file, op_type in files.items():
        nodes = [n for n in onnx.load(bundle / file).graph.node if n.op_type == op_type]
        biased = [n for n in nodes if len(n.input) > 5 and n.input[5]]  # attention_bias fed
        assert len(biased) == 2  # each self-attention of the 2 layers
    parity = json.loads((bundle / C.MANIFEST_FILE).read_text())["parity"]
    group = parity["source"]
    assert group["passed"] and group["level3"]["beam"]["identical"] > 0
    assert all(parity[key]["passed"] for key in ("steps", "inplace", "search"))
    hf = AutoTokenizer.from_pretrained(t5_dirs["1.1"])
    model = AutoModelForSeq2SeqLM.from_pretrained(t5_dirs["1.1"]).eval()
    loop = Generator.load(bundle, search="loop")  # beam: the in-place decoder
    graph = Generator.load(bundle, search="graph")  # the one-graph BeamSearch
    assert loop.in_place is not None
    for beam in (1, 4):
        batch = hf(TEXTS, return_tensors="pt", padding=True)
        options = {"num_beams": beam, "early_stopping": True} if beam > 1 else {}
        out = model.generate(**batch, max_new_tokens=MAX_NEW, **options)
        want = hf.batch_decode(out, skip_special_tokens=True)
        opts = GenerationOptions(max_new_tokens=MAX_NEW, beam_size=beam)
        for gen in (loop, graph):
            assert [r.text for r in gen.generate(TEXTS, opts)] == want, (gen.search_mode, beam)
        args = ["generate", str(bundle), *TEXTS, "--max-new-tokens", str(MAX_NEW)]
        result = CliRunner().invoke(cli, [*args, "--beam", str(beam)])
        assert result.exit_code == 0 and result.stdout.splitlines() == want, result.output


def test_steps_decoder_rows_at_different_positions_give_the_sources_ids(
    bundle: Path, sources: dict
) -> None:
    """Greedy through the step-batching decoder, one row joining per step (each row at its
    own position, the relative bias of its own slots) = transformers' greedy ids."""
    source = sources["1.1"]
    ids = inputs(source)[:8]
    want = source.reference.generate(ids, 1, MAX_NEW)
    steps = StepsDecoder.open(Generator.load(bundle, search="loop"))
    assert steps is not None
    batch, cfg = LiveBatch(steps), steps.config
    got: dict[int, list[int]] = {}
    row_of: dict[int, int] = {}  # slot -> input
    last = np.zeros(0, dtype=np.int64)
    while len(got) < len(ids) or row_of:
        if len(got) < len(ids):
            (slot,) = batch.join([ids[len(got)]])
            row_of[slot], got[len(got)] = len(got), []
            last = np.resize(last, batch.rows)
            last[slot] = cfg.bos_id
        chosen = batch.step(last).argmax(-1)
        for slot, row in list(row_of.items()):
            token = int(chosen[slot])
            if token != cfg.eos_id:
                got[row].append(token)
            if token == cfg.eos_id or len(got[row]) == MAX_NEW:
                batch.leave([slot])
                del row_of[slot]
            last[slot] = token
    assert [got[i] for i in range(len(ids))] == want


def test_mt5_model_type_maps_the_same(t5_dirs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "mt5"
    shutil.copytree(t5_dirs["1.1"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"model_type": "mt5"}))
    source = load(path)
    assert type(source.reference.model).__name__ == "MT5ForConditionalGeneration"
    src = right_pad(inputs(source)[:4], 0)
    tgt = np.array([[1, 5, 6, 7]] * 4)
    with torch.no_grad():
        ours = source.model(torch.as_tensor(src), torch.as_tensor(tgt)).numpy()
    assert np.abs(ours - source.reference.logits(src, tgt).numpy()).max() < 1e-4


def run_main(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """`edgeseq ARGV` as the console runs it: (exit code, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code), capsys.readouterr().err


def _export_fails(
    path: Path, out: Path, match: str, capsys: pytest.CaptureFixture, *more: str
) -> None:
    code, err = run_main(["export", str(path), "--out", str(out), *more], capsys)
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert match in lines[0] and not out.exists()


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"feed_forward_proj": "gated-tanh"}, "activation 'tanh' is not mapped (edgeseq has"),
        ({"feed_forward_proj": "relu-gated"}, "is not of the form ACT or gated-ACT"),
        ({"decoder_start_token_id": 1}, "decoder_start_token_id are (0, 1, 1), not T5's"),
        ({"vocab_size": 300}, "the tokenizer has 411 ids but the model's embedding has 301 rows"),
        ({"num_heads": None}, "config.json lacks num_heads (integers): not a T5 config"),
    ],
)
def test_refuses_what_does_not_map(
    t5_dirs: dict[str, Path],
    tmp_path: Path,
    changes: dict[str, Any],
    match: str,
    capsys: pytest.CaptureFixture,
) -> None:
    path = tmp_path / "changed"
    shutil.copytree(t5_dirs["1.0"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))
    _export_fails(path, tmp_path / "out", match, capsys)


def test_refuses_another_model_type_and_unused_weights(
    t5_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "bart"
    shutil.copytree(t5_dirs["1.0"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"model_type": "bart"}))
    with pytest.raises(SourceError, match="model_type is 'bart'; the t5 adapter reads"):
        load(path)
    _export_fails(path, tmp_path / "out", "model_type is 'bart'", capsys, "--source", "t5")
    path = tmp_path / "deeper"
    shutil.copytree(t5_dirs["1.0"], path)
    (path / "config.json").write_text(json.dumps(config | {"num_layers": 1}))
    _export_fails(path, tmp_path / "out2", "the weights hold encoder.block.1.", capsys)


def test_refuses_a_tokenizer_that_does_not_fit_the_weights(
    t5_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`</s>` and `<unk>` swapped in tokenizer.json: T5's weights have `</s>` at 1."""
    path = tmp_path / "swapped"
    shutil.copytree(t5_dirs["1.0"], path)
    data = json.loads((path / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab[1], vocab[2] = vocab[2], vocab[1]
    data["model"]["unk_id"] = 1
    for added in data["added_tokens"]:
        added["id"] = {1: 2, 2: 1}.get(added["id"], added["id"])
    (path / "tokenizer.json").write_text(json.dumps(data))
    _export_fails(path, tmp_path / "out", "have ids (0, 2, 1), not T5's (0, 1, 2)", capsys)


def test_inputs_and_outputs_run_past_n_positions(tmp_path: Path) -> None:
    """T5 has no positional table: with n_positions 8 (a v1.0, every group passing, steps
    included), a 30-token source and 40 new tokens give transformers' ids (greedy and beam 4;
    loop, in-place decoder and one-graph search); n_positions stays the default budget."""
    path = build_t5_dir(tmp_path / "t5", version="1.0", n_positions=8)
    out = tmp_path / "bundle"
    args = ["export", str(path), "--out", str(out), "--inputs", "20"]
    result = CliRunner().invoke(cli, [*args, "--variants", "fp32,steps,inplace,search"])
    assert result.exit_code == 0, result.output
    parity = json.loads((out / C.MANIFEST_FILE).read_text())["parity"]  # v1.0: each group
    assert all(parity[key]["passed"] for key in ("source", "steps", "inplace", "search"))
    hf = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    words = [line.split()[0] for line in synthetic_corpus("source", 40, seed=3)]
    texts = [" ".join(words[:12]), " ".join(words[12:30])]
    batch = hf(texts, return_tensors="pt", padding=True)
    assert batch.input_ids.shape[1] > 8 * 3
    loop = Generator.load(out, search="loop")
    graph = Generator.load(out, search="graph")
    for beam in (1, 4):
        options = {"num_beams": beam, "early_stopping": True} if beam > 1 else {}
        want = model.generate(**batch, max_new_tokens=40, **options)
        expected = []  # edgeseq ids without the decoder start and </s>
        for row in want[:, 1:].tolist():
            expected.append(to_edgeseq(row[: row.index(1)] if 1 in row else row))
        assert max(map(len, expected)) > 8 * 3
        opts = GenerationOptions(max_new_tokens=40, beam_size=beam)
        for gen in (loop, graph):
            got = [list(r.token_ids) for r in gen.generate(texts, opts)]
            assert got == expected, (gen.search_mode, beam)
    default = loop.generate(texts[:1])[0]
    assert len(default.token_ids) <= 8  # the default budget: n_positions


def test_task_prefixes_from_the_checkpoint(
    bundle: Path, t5_dirs: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    """config.json's task_specific_params become the bundle's task_prefixes; a named task puts
    its prefix before every input, with the same answer from the API, the CLI and the server
    (transformers' on the prefixed texts); an unknown task is one line naming the known."""
    from serve_client import generate, running

    from edgeseq.runtime.errors import OptionsError
    from edgeseq.runtime.serve.app import create_app

    config = json.loads((bundle / C.CONFIG_FILE).read_text())
    assert config["task_prefixes"] == {name: p["prefix"] for name, p in TASK_PARAMS.items()}
    task = "translation_en_to_de"
    hf = AutoTokenizer.from_pretrained(t5_dirs["1.1"])
    model = AutoModelForSeq2SeqLM.from_pretrained(t5_dirs["1.1"]).eval()
    prefixed = [TASK_PARAMS[task]["prefix"] + text for text in TEXTS]
    out = model.generate(**hf(prefixed, return_tensors="pt", padding=True), max_new_tokens=MAX_NEW)
    want = hf.batch_decode(out, skip_special_tokens=True)
    gen = Generator.load(bundle)
    opts = GenerationOptions(max_new_tokens=MAX_NEW)
    assert [r.text for r in gen.generate(TEXTS, opts, task=task)] == want
    assert [r.text for r in gen.generate(TEXTS, opts)] != want  # the prefix is what changed
    args = ["generate", str(bundle), *TEXTS, "--max-new-tokens", str(MAX_NEW)]
    result = CliRunner().invoke(cli, [*args, "--task", task])
    assert result.exit_code == 0 and result.stdout.splitlines() == want, result.output
    with running(create_app(gen)) as port:
        status, body = generate(port, TEXTS, {"task": task, "max_new_tokens": MAX_NEW})
        assert status == 200 and [r["output"] for r in body["results"]] == want, body
        status, body = generate(port, TEXTS, {"task": "translation_en_to_xx"})
        assert status == 422 and "summarization, translation_en_to_de" in str(body), body
    known = "this bundle's tasks: summarization, translation_en_to_de, translation_en_to_fr"
    with pytest.raises(OptionsError, match=f"unknown task 'translate'; {known}"):
        gen.generate(TEXTS, task="translate")
    code, err = run_main([*args, "--task", "translate"], capsys)
    assert (
        code == 1
        and err.count("\n") == 1
        and err.startswith(f"error: unknown task 'translate'; {known}")
    ), err
