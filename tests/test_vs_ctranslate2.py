"""benchmarks/ct2_convert.py and benchmarks/vs_ctranslate2.py (need the `bench` extra).

The conversion is checked numerically (CTranslate2's log-probabilities of given targets vs
PyTorch's, for both test configurations: post/pre-norm, sinusoidal/learned, relu/gelu,
separate/tied output) and by greedy ids on a trained model; the benchmark script is run
once on a tiny checkpoint with one pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 not installed (extra 'bench')")
torch = pytest.importorskip("torch")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import ct2_convert  # noqa: E402
import harness  # noqa: E402
import vs_ctranslate2  # noqa: E402
import vs_ctranslate2_engines as ct2_engines  # noqa: E402


def _random_pairs(cfg, n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """`n` random (source ending with </s>, target without <s>/</s>) id lists."""
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for _ in range(n):
        src = rng.integers(4, cfg.src_vocab_size, size=rng.integers(1, 9)).tolist()
        sources.append([*src, cfg.eos_id])
        targets.append(rng.integers(4, cfg.tgt_vocab_size, size=rng.integers(1, 9)).tolist())
    return sources, targets


@pytest.mark.parametrize("name", ["post-sin-relu", "pre-learned-gelu-tied"])
def test_ctranslate2_scores_equal_pytorch_logprobs(export_model_factory, name, tmp_path) -> None:
    model, _ = export_model_factory(name)
    cfg = model.cfg
    path = ct2_convert.convert_to_ctranslate2(model, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(path), compute_type="float32", intra_threads=1)
    src_vocab = ct2_convert.ct2_vocabulary(cfg.src_vocab_size)
    tgt_vocab = ct2_convert.ct2_vocabulary(cfg.tgt_vocab_size)
    sources, targets = _random_pairs(cfg, 12)
    scored = translator.score_batch(
        [[src_vocab[i] for i in s] for s in sources], [[tgt_vocab[i] for i in t] for t in targets]
    )
    worst = 0.0
    for src, tgt, result in zip(sources, targets, scored, strict=True):
        with torch.inference_mode():
            tgt_in = torch.tensor([[cfg.bos_id, *tgt]])
            logits = model(torch.tensor([src]), tgt_in)[0]  # (T+1, V)
            logprobs = torch.log_softmax(logits, dim=-1)
        expected = [float(logprobs[t, i]) for t, i in enumerate([*tgt, cfg.eos_id])]
        worst = max(worst, float(np.max(np.abs(np.array(result.log_probs) - expected))))
    assert worst < 1e-4, f"max |Δ log-prob| {worst:.2e}"


def test_ctranslate2_greedy_ids_equal_pytorch_on_a_trained_model(runtime_model, tmp_path) -> None:
    from edgeseq.build_model.torch_step import TorchStep
    from edgeseq.export.parity import random_sources
    from edgeseq.runtime.search import GenerationOptions

    model = runtime_model.model
    sources = random_sources(model, 24)
    ct2_dir = ct2_convert.convert_to_ctranslate2(model, tmp_path / "ct2")
    ct2 = ct2_engines.Ct2Engine("ctranslate2 fp32", ct2_dir, "float32", 1, model.cfg)
    torch_engine = ct2_engines.SearchEngine("pytorch", TorchStep(model), model.cfg.pad_id)
    batches = harness.cut(sources, 8)
    ours, _ = torch_engine.run(batches, 1)
    theirs, _ = ct2.run(batches, 1)
    assert theirs == ours
    # edgeseq's default (no bundle generation defaults) is CTranslate2's, relied upon
    assert GenerationOptions().filled().length_penalty == 1.0


@pytest.fixture(scope="module")
def checkpoint(runtime_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained runtime model as a checkpoint of the synthetic `reverse` task."""
    from edgeseq.build_model.checkpoint import save_checkpoint

    path = tmp_path_factory.mktemp("vs-ct2") / "ckpt"
    task = {"name": "reverse", "options": {}}
    return save_checkpoint(path, runtime_model.model, runtime_model.tokenizers, task, {"step": 0})


def test_script_reports_every_engine_and_cell(checkpoint, tmp_path, capsys) -> None:
    out = tmp_path / "vs.json"
    args = [str(checkpoint), "--words", "6", "--passes", "1", "--batch-sizes", "1,3"]
    assert vs_ctranslate2.main([*args, "--beams", "1,2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["sources"] == "task reverse: 6 test sources"
    same = {"equal": 6, "of": 6, "first_difference": None}
    assert report["agreement"]["ctranslate2 fp32"] == same
    assert sorted(report["cells"]) == [
        "beam 2, batch 1", "beam 2, batch 3", "greedy, batch 1", "greedy, batch 3"
    ]  # fmt: skip
    greedy, beam = report["cells"]["greedy, batch 3"], report["cells"]["beam 2, batch 1"]
    assert set(greedy) == set(report["engines"])  # PyTorch eager: greedy only
    assert set(beam) == set(report["engines"]) - {"pytorch eager"}
    assert greedy["ctranslate2 fp32"]["ratio_per_pass"] == [1.0]
    for cell in report["cells"].values():
        for numbers in cell.values():
            assert len(numbers["tokens_per_s"]) == 1 and numbers["tokens_per_s"][0] > 0
    printed = capsys.readouterr().out
    assert "| edgeseq int8 |" in printed and "beam 2 (tokens/s relative to" in printed
    assert printed.index("greedy (") < printed.index("beam 2 (")
    assert printed.count("| *edgeseq int8 / ctranslate2 int8* |") == 4  # 2 searches x 2 patterns
    assert printed.count("| *edgeseq fp32 / pytorch eager* |") == 2  # greedy only
    assert sorted(report["patterns"]) == ["batch", "pass"]
    assert report["cells"] == report["patterns"]["pass"]
    for pattern in report["patterns"].values():
        assert set(pattern["greedy, batch 3"]) == set(report["engines"])
    # generate (the user's path) and the two-graph loop of each precision; the bundle the
    # script exports has the search variant, which search "auto" takes in every cell today
    assert {"edgeseq fp32", "edgeseq fp32 loop", "edgeseq int8 loop"} <= set(report["engines"])
    assert report["generate_paths"]["edgeseq fp32: beam 2, batch 3"] == ["graph"]
    assert "path `generate` took" in printed


def test_script_refuses_a_missing_model_in_one_line(tmp_path, capsys) -> None:
    assert vs_ctranslate2.main([str(tmp_path / "nothing"), "--passes", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "neither a checkpoint directory" in err
    assert len(err.splitlines()) == 1


def test_script_refuses_bad_bounds() -> None:
    bad_options = (["--passes", "0"], ["--words", "-3"], ["--batch-sizes", "1,x"])
    for bad in (*bad_options, ["--patterns", "step"], ["--patterns", ","]):
        with pytest.raises(SystemExit, match="2"):
            vs_ctranslate2.parse_args(["models/g2p-en", *bad])


class _FakeEngine:
    """An engine with fixed greedy outputs whose teacher-forced log-probabilities are
    -1 per token plus `offset`."""

    def __init__(self, name: str, outputs: list[tuple[int, ...]], offset: float = 0.0) -> None:
        self.name, self.outputs, self.offset, self.max_len = name, outputs, offset, 20

    def run(self, batches, beam):
        return self.outputs, sum(len(o) + 1 for o in self.outputs)

    def token_logprobs(self, source, tokens):
        return [-1.0 + self.offset] * len(tokens)


@pytest.mark.parametrize("offset", [3e-5, 0.5])
def test_agreement_measures_how_far_a_differing_output_is_from_a_tie(offset) -> None:
    ours = [(5, 6), (7,), (8, 9, 10)]
    theirs = [(5, 6), (7, 4), (8, 9, 10)]
    engines = [_FakeEngine("edgeseq fp32", ours), _FakeEngine("ctranslate2 fp32", theirs, offset)]
    result = vs_ctranslate2.agreement(engines, [[4, 2], [5, 2], [6, 2]], 3)
    ct2 = result["ctranslate2 fp32"]
    assert (ct2["equal"], ct2["of"], ct2["first_difference"]) == (2, 3, 1)
    assert ct2["tie_gap"] == pytest.approx(offset)
    assert (ct2["tie_gap"] > vs_ctranslate2.TIE_GAP) == (offset > 0.1)
    assert result["edgeseq fp32"] == {"equal": 3, "of": 3, "first_difference": None}


def test_both_engines_teacher_force_the_same_logprobs(runtime_case, tmp_path) -> None:
    from edgeseq.runtime.bundle import load_bundle
    from edgeseq.runtime.kinds.seq2seq import OrtStep

    model = runtime_case.model
    bundle = load_bundle(runtime_case.bundle)
    ours = ct2_engines.SearchEngine(
        "edgeseq fp32", OrtStep.from_files(*bundle.graphs("fp32"), bundle.config), 0
    )
    ct2_dir = ct2_convert.convert_to_ctranslate2(model, tmp_path / "ct2")
    theirs = ct2_engines.Ct2Engine("ctranslate2 fp32", ct2_dir, "float32", 1, model.cfg)
    source, tokens = [5, 6, 7, 2], [8, 4, 9, 9, 5]
    a, b = ours.token_logprobs(source, tokens), theirs.token_logprobs(source, tokens)
    assert len(a) == len(b) == 5
    np.testing.assert_allclose(a, b, atol=1e-4)
