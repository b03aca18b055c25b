"""Importing a Hugging Face MarianMT checkpoint (export/sources/marian.py): our model's logits
and searches against MarianMTModel's own, in edgeseq ids, and what the adapter refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the Marian importer needs the hf extra")
pytest.importorskip("sentencepiece", reason="the Marian importer needs the hf extra")

from hf_fixtures import build_marian_dir
from safetensors.torch import load_file, save_file
from transformers import MarianMTModel, MarianTokenizer

from edgeseq.build_model.torch_step import TorchStep
from edgeseq.export.sources import SourceError, SourceModel
from edgeseq.export.sources.marian import SUPPRESSED, detect, load
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import beam_search, greedy_search

MAX_NEW = 20


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_marian_dir(tmp_path_factory.mktemp("marian") / "shared")


@pytest.fixture(scope="module")
def separate_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_marian_dir(tmp_path_factory.mktemp("marian") / "separate", shared_vocab=False)


def derived(base: Path, out: Path, change: Any) -> Path:
    """A copy of checkpoint `base` whose MarianMTModel `change(model)` returns (and saves)."""
    shutil.copytree(base, out)
    model = change(MarianMTModel.from_pretrained(base).eval())
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def search_dir(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights large enough that the decoder follows its input, and a `</s>` bias at
    which rows finish at different lengths (some at the cap): a model whose greedy and beam
    outputs differ, with no near tie among these inputs (found by trying seeds)."""

    def change(model: MarianMTModel) -> MarianMTModel:
        torch.manual_seed(1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.dim() == 2 and "embed" not in name and "shared" not in name:
                    param.normal_(0.0, 0.2)
            model.final_logits_bias.zero_()
            model.final_logits_bias[0, 0] = 3.2  # Marian's </s>
        return model

    return derived(shared_dir, tmp_path_factory.mktemp("marian") / "search", change)


def batches(cfg: Any, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded sources ending with </s> and targets starting with <s>, edgeseq ids."""
    rng = np.random.default_rng(seed)

    def rows(lengths: list[int], first: list[int], last: list[int], vocab: int) -> np.ndarray:
        return right_pad([first + rng.integers(4, vocab, n).tolist() + last for n in lengths], 0)

    src = rows([6, 2, 9], [], [cfg.eos_id], cfg.src_vocab_size)
    tgt = rows([4, 7, 1], [cfg.bos_id], [], cfg.tgt_vocab_size)
    return src, tgt


def assert_same_logits(source: SourceModel, atol: float = 1e-4) -> None:
    """Full decode and cached decode_step == MarianMTModel at every real position, every
    column (<pad> and <s> exactly SUPPRESSED on both sides)."""
    model, cfg = source.model, source.model.cfg
    src, tgt = batches(cfg)
    want = source.reference.logits(torch.as_tensor(src), tgt).numpy()
    src_t, tgt_t = torch.as_tensor(src), torch.as_tensor(tgt)
    with torch.no_grad():
        full = model(src_t, tgt_t).numpy()
        keep = model.source_keep(src_t)
        cross_k, cross_v = model.cross_kv(model.encode(src_t, keep))
        past_k, past_v = model.empty_cache(len(src), cross_k[0])
        steps = []
        for t in range(tgt.shape[1]):
            logits, past_k, past_v = model.decode_step(
                tgt_t[:, t : t + 1], past_k, past_v, cross_k, cross_v, keep
            )
            steps.append(logits[:, 0].numpy())
    real = tgt != cfg.pad_id
    assert np.abs(full[real] - want[real]).max() < atol
    assert np.abs(np.stack(steps, axis=1)[real] - want[real]).max() < atol
    assert (want[..., :2] == SUPPRESSED).all() and (full[..., :2] == SUPPRESSED).all()


def test_config_and_rows(shared_dir: Path) -> None:
    assert detect(shared_dir) and not detect(shared_dir.parent)
    source = load(shared_dir)
    cfg = source.model.cfg
    marian = json.loads((shared_dir / "config.json").read_text())
    assert (cfg.src_vocab_size, cfg.tgt_vocab_size) == (marian["vocab_size"] + 1,) * 2
    assert (cfg.positional, cfg.norm, cfg.activation) == ("sinusoidal-halves", "post", "silu")
    assert cfg.scale_embedding and cfg.tie_output and cfg.output_bias and not cfg.has_final_norm
    assert cfg.max_len == marian["max_position_embeddings"] and source.adapter == "marian"
    table = source.model.tgt_embed.weight
    pad = marian["pad_token_id"]
    state = load_file(str(shared_dir / "model.safetensors"))
    shared = state["model.shared.weight"]
    assert torch.equal(table[0], shared[pad]) and torch.equal(table[1], shared[pad])
    assert torch.equal(table[2], shared[0]) and torch.equal(table[3], shared[1])
    assert torch.equal(table[4:], shared[2:pad])
    assert source.tokenizers.shared


def test_logits_equal_marians(shared_dir: Path) -> None:
    assert_same_logits(load(shared_dir))


def test_separate_vocabularies(separate_dir: Path) -> None:
    source = load(separate_dir)
    assert not source.tokenizers.shared
    assert_same_logits(source)


def test_untied_output(shared_dir: Path, tmp_path: Path) -> None:
    def untie(model: MarianMTModel) -> MarianMTModel:
        model.config.tie_word_embeddings = False
        untied = MarianMTModel(model.config).eval()
        untied.load_state_dict(model.state_dict())
        with torch.no_grad():
            untied.lm_head.weight.copy_(torch.randn_like(untied.lm_head.weight) * 0.2)
        return untied

    source = load(derived(shared_dir, tmp_path / "untied", untie))
    assert not source.model.cfg.tie_output
    assert "lm_head.weight" in load_file(str(tmp_path / "untied" / "model.safetensors"))
    assert_same_logits(source)

    def pad_row(model: MarianMTModel) -> MarianMTModel:
        with torch.no_grad():
            model.model.shared.weight[model.config.pad_token_id] = 0.3
        return model

    # Tied, but the pad row (the decoder start, <pad> and <s> in the output) is not zero: the
    # output gets its own copy whose <pad> and <s> rows are zero.
    source = load(derived(shared_dir, tmp_path / "pad-row", pad_row))
    assert not source.model.cfg.tie_output
    assert (source.model.tgt_embed.weight[:2] == 0.3).all()
    assert_same_logits(source)


def test_tokenizers_give_marians_ids(shared_dir: Path) -> None:
    source = load(shared_dir)
    marian = MarianTokenizer.from_pretrained(shared_dir)
    for text in ("The quick brown fox.", "naïve façade 123"):
        marian_ids = marian(text).input_ids  # pieces then </s>
        want = [2 if m == 0 else 3 if m == 1 else m + 2 for m in marian_ids]
        assert [*source.tokenizers.source.encode(text), 2] == want


def test_greedy_and_beam_equal_marians_generate(search_dir: Path) -> None:
    source = load(search_dir)
    rng = np.random.default_rng(0)
    sources = [[*rng.integers(4, 60, rng.integers(2, 9)).tolist(), 2] for _ in range(12)]
    step, src = TorchStep(source.model), right_pad(sources, 0)
    greedy = greedy_search(step, src, MAX_NEW)
    assert source.reference.generate(sources, 1, MAX_NEW) == greedy
    beam = [list(h[0].tokens) for h in beam_search(step, src, 4, MAX_NEW)]
    assert source.reference.generate(sources, 4, MAX_NEW) == beam
    lengths = {len(ids) for ids in greedy + beam}
    assert MAX_NEW in lengths and len(lengths) > 3  # rows at the cap, rows finishing early
    assert greedy != beam


def test_pytorch_model_bin(shared_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bin"
    shutil.copytree(shared_dir, out)
    state = load_file(str(out / "model.safetensors"))
    (out / "model.safetensors").unlink()
    torch.save(state, out / "pytorch_model.bin")
    weights = dict(load(shared_dir).model.state_dict())
    assert all(torch.equal(v, weights[k]) for k, v in load(out).model.state_dict().items())
    torch.save({"model": torch.nn.Linear(2, 2)}, out / "pytorch_model.bin")  # pickled object
    with pytest.raises(SourceError, match=r"cannot be read with torch.load\(weights_only=True\)"):
        load(out)
    (out / "pytorch_model.bin").unlink()
    with pytest.raises(SourceError, match=r"has neither model\.safetensors nor pytorch_model\.bin"):
        load(out)


def _edit_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(model_type="bart"), "model_type is 'bart'; the marian adapter reads model_type"),
        (dict(normalize_before=True), "normalize_before is true .mBART-style."),
        (dict(activation_function="gelu_new"), "activation_function 'gelu_new' is not mapped"),
        (dict(decoder_ffn_dim=48), "encoder_ffn_dim != decoder_ffn_dim"),
        (dict(decoder_start_token_id=0), "decoder_start_token_id 0 is not the pad id"),
        (dict(vocab_size=7), "vocab.json has .* entries but config.json says 7"),
    ],
)
def test_refuses_configs_that_do_not_map(
    shared_dir: Path, tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    out = tmp_path / "changed"
    shutil.copytree(shared_dir, out)
    _edit_config(out, **changes)
    with pytest.raises(SourceError, match=match):
        load(out)


def test_refuses_weights_the_map_does_not_use(shared_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "extra"
    shutil.copytree(shared_dir, out)
    state = load_file(str(out / "model.safetensors"))
    state["model.encoder.layernorm_embedding.weight"] = torch.ones(32)
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(SourceError, match=r"hold model\.encoder\.layernorm_embedding\.weight"):
        load(out)
    del state["model.encoder.layernorm_embedding.weight"], state["final_logits_bias"]
    del state["model.decoder.layers.1.fc2.bias"]
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(SourceError, match=r"lack model\.decoder\.layers\.1\.fc2\.bias"):
        load(out)
