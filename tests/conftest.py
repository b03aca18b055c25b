"""Shared session-scoped fixtures. Append-only: several test modules rely on these."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


# -- export: tiny models exported once per session ------------------------------------------
@dataclass
class ExportCase:
    """A tiny random model, its tokenizers and the bundle exported from it (with parity)."""

    name: str
    model: Any  # Seq2SeqTransformer
    tokenizers: Any  # TokenizerPair
    bundle: Path
    manifest: dict[str, Any]


# Two configurations covering every option between them: post/pre-norm, sinusoidal/learned
# positions, relu/gelu, separate/tied output, 4 heads of 8 / 3 heads of 16, odd vocab sizes,
# unequal encoder/decoder depths. Each export costs ~10 s, so there are only two.
# fmt: off
EXPORT_CONFIGS = {
    "post-sin-relu": dict(
        d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=48, max_len=32,
        norm="post", positional="sinusoidal", activation="relu", tie_output=False,
        src_symbols=25, tgt_symbols=33,
    ),
    "pre-learned-gelu-tied": dict(
        d_model=48, n_heads=3, n_encoder_layers=2, n_decoder_layers=1, d_ff=64, max_len=40,
        norm="pre", positional="learned", activation="gelu", tie_output=True,
        src_symbols=27, tgt_symbols=37,
    ),
}
# fmt: on


def make_export_model(name: str, seed: int = 0, tgt_symbols: int | None = None) -> tuple[Any, Any]:
    """(model, tokenizers) of EXPORT_CONFIGS[name]: random weights, char source vocabulary,
    word target vocabulary of `tgt_symbols` words (default: the config's); vocab sizes =
    symbols + 4 specials."""
    import torch

    from edgeseq.build_model.model import Seq2SeqTransformer
    from edgeseq.runtime.config import ModelConfig
    from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

    options = dict(EXPORT_CONFIGS[name])
    src_symbols, words = options.pop("src_symbols"), options.pop("tgt_symbols")
    tgt_symbols = words if tgt_symbols is None else tgt_symbols
    source = Tokenizer.train_char([string.ascii_letters[:src_symbols]])
    target = Tokenizer.train_word([" ".join(f"T{i}" for i in range(tgt_symbols))])
    cfg = ModelConfig(
        src_vocab_size=source.vocab_size, tgt_vocab_size=target.vocab_size, dropout=0.0, **options
    )
    torch.manual_seed(seed)
    return Seq2SeqTransformer(cfg).eval(), TokenizerPair(source, target)


@pytest.fixture(scope="session", params=sorted(EXPORT_CONFIGS))
def export_case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Each EXPORT_CONFIGS model exported (with parity on 200 random inputs) once per session."""
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle

    model, tokenizers = make_export_model(request.param)
    bundle = tmp_path_factory.mktemp("bundles") / request.param
    manifest = export_bundle(model, tokenizers, bundle, max_new_tokens=20)
    return ExportCase(request.param, model, tokenizers, bundle, manifest)


@pytest.fixture(scope="session")
def export_model_factory():
    """`make_export_model(name, seed=0) -> (model, tokenizers)` for tests that export again."""
    return make_export_model


# -- runtime (issue 4): one small trained model and its bundle --------------------------------
@dataclass
class RuntimeCase:
    """A tiny model trained ~150 steps to reverse and upper-case letters (so outputs have
    varied lengths and untied logits), its tokenizers, and its bundle (exported once)."""

    model: Any  # Seq2SeqTransformer, eval mode
    tokenizers: Any  # TokenizerPair: char source "a".."j", char target "A".."J"
    bundle: Path | None = None


RUNTIME_LETTERS = "abcdefghij"


def make_runtime_model(steps: int = 150, seed: int = 0) -> RuntimeCase:
    """Train the RuntimeCase model (d_model 32, 2+2 layers, max_len 20; ~2 s on one thread)."""
    import numpy as np
    import torch
    from torch.nn import functional as F

    from edgeseq.build_model.model import Seq2SeqTransformer
    from edgeseq.runtime.config import ModelConfig
    from edgeseq.runtime.tokenizer import Tokenizer, TokenizerPair

    source = Tokenizer.train_char([RUNTIME_LETTERS])
    target = Tokenizer.train_char([RUNTIME_LETTERS.upper()])
    cfg = ModelConfig(
        src_vocab_size=source.vocab_size, tgt_vocab_size=target.vocab_size, d_model=32,
        n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, max_len=20, dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(cfg)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            texts = [
                "".join(rng.choice(list(RUNTIME_LETTERS), rng.integers(1, 9))) for _ in range(32)
            ]
            src = torch.as_tensor(source.encode_batch(texts, add_eos=True))
            tgt = target.encode_batch([t[::-1].upper() for t in texts], add_bos=True, add_eos=True)
            tgt_in, tgt_out = torch.as_tensor(tgt[:, :-1]), torch.as_tensor(tgt[:, 1:])
            loss = F.cross_entropy(model(src, tgt_in).transpose(1, 2), tgt_out, ignore_index=0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return RuntimeCase(model.eval(), TokenizerPair(source, target))


@pytest.fixture(scope="session")
def runtime_model() -> RuntimeCase:
    """The trained RuntimeCase model without a bundle (torch-side search tests)."""
    return make_runtime_model()


@pytest.fixture(scope="session")
def runtime_case(runtime_model: RuntimeCase, tmp_path_factory: pytest.TempPathFactory):
    """runtime_model exported to a bundle (parity not re-run here; tests compare engines)."""
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle

    bundle = tmp_path_factory.mktemp("runtime") / "reverse-tiny"
    task = {"name": "reverse", "options": {}}
    export_bundle(runtime_model.model, runtime_model.tokenizers, bundle, task=task, verify=False)
    return RuntimeCase(runtime_model.model, runtime_model.tokenizers, bundle)


@pytest.fixture
def one_torch_thread():
    """Run a test with one torch thread: the test machines have 2 shared cores, and torch's
    thread pool slows tiny models down by 100x when oversubscribed."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- build_model (issue 2): a small synthetic task and a recipe that trains in ~1 s ---------------
# Model and training fields of a flat recipe (see models/recipes/); tests override single fields.
SMALL_RECIPE = dict(
    d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.1,
    max_len=16, batch_tokens=300, warmup=60, lr_factor=1.0, epochs=2, label_smoothing=0.1,
    clip=1.0, eval_max_items=20, eval_loss_max_items=40, eval_batch_size=20, save_every=1000,
    log_every=2,
)  # fmt: skip


@pytest.fixture(scope="session")
def small_reverse_task():
    """`reverse` on 400 strings of 1..6 letters: ~360 train pairs, ~13 batches per epoch."""
    from edgeseq.build_model.tasks import load_task

    return load_task("reverse", size=400, max_len=6)


@pytest.fixture(scope="session")
def small_recipe_factory():
    """`make(**overrides) -> Recipe` from SMALL_RECIPE."""
    from edgeseq.build_model.train import Recipe

    return lambda **overrides: Recipe.from_dict({**SMALL_RECIPE, **overrides})


@pytest.fixture(scope="session")
def trained_run(small_reverse_task, small_recipe_factory, tmp_path_factory):
    """120 steps (~9 epochs) on the small reverse task: the run directory and the summary
    (shared by the train, evaluate and grow tests)."""
    import torch

    from edgeseq.build_model.train import train

    out = tmp_path_factory.mktemp("run") / "rev"
    threads = torch.get_num_threads()
    try:
        summary = train(
            small_reverse_task,
            small_recipe_factory(epochs=20),
            out,
            seed=0,
            max_steps=120,
            threads=1,
            progress=False,
        )
    finally:
        torch.set_num_threads(threads)
    return out, summary


# -- the one-graph search variant (issue 27) ------------------------------------------------------
@pytest.fixture(scope="session")
def search_bundle(runtime_model: RuntimeCase, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runtime_model exported with the fp32, int8, ort and search variants (no parity)."""
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle
    from edgeseq.export.variants import VariantOptions

    bundle = tmp_path_factory.mktemp("search") / "reverse-search"
    task = {"name": "reverse", "options": {}}
    export_bundle(
        runtime_model.model, runtime_model.tokenizers, bundle, task=task, verify=False,
        variants=VariantOptions(("fp32", "int8", "ort", "search")),
    )  # fmt: skip
    return bundle


# -- GPT and BERT (issue 30): tiny models trained 40 steps on words / stress, with int8 --------
LM_RECIPE = dict(
    d_model=32, n_heads=4, d_ff=64, dropout=0.0, max_len=24, batch_tokens=800, warmup=20,
    lr_factor=2.0, epochs=1, label_smoothing=0.0, eval_max_items=50, eval_loss_max_items=200,
    eval_batch_size=50, save_every=1000, log_every=10,
)  # fmt: skip
LM_LAYERS = {"words": {"architecture": "decoder-only", "n_decoder_layers": 2},
             "stress": {"architecture": "encoder-only", "n_encoder_layers": 2}}  # fmt: skip


def train_and_export_lm(task_name: str, root: Path) -> dict[str, Any]:
    """Train `task_name` ("words": GPT, "stress": BERT) 40 steps on one torch thread and
    export fp32 + int8 with parity: {"bundle", "manifest", "run"}."""
    import torch

    from edgeseq.build_model.recipe import Recipe
    from edgeseq.build_model.tasks import load_task
    from edgeseq.build_model.train import train
    from edgeseq.export.options import ExportOptions
    from edgeseq.export.pipeline import export_checkpoint
    from edgeseq.export.variants import VariantOptions

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recipe = Recipe.from_dict(LM_RECIPE | LM_LAYERS[task_name])
        train(load_task(task_name), recipe, root / "run", max_steps=40, threads=1, progress=False)
        options = VariantOptions(("fp32", "int8"), max_metric_drop=100.0)
        bundle = root / "bundle"
        manifest = export_checkpoint(
            root / "run" / "last", bundle, ExportOptions(inputs=60, variants=options)
        )
    finally:
        torch.set_num_threads(threads)
    return {"bundle": bundle, "manifest": manifest, "run": root / "run" / "last"}


@pytest.fixture(scope="session")
def gpt_case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A GPT trained 40 steps on `words`, exported with int8."""
    return train_and_export_lm("words", tmp_path_factory.mktemp("gpt"))


@pytest.fixture(scope="session")
def bert_case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A BERT classifier trained 40 steps on `stress`, exported with int8."""
    return train_and_export_lm("stress", tmp_path_factory.mktemp("bert"))


# -- step batching (issue 38 item 4): the decoder for rows at different positions -------------
def export_runtime_variants(
    runtime_model: RuntimeCase, directory: Path, variants: tuple[str, ...]
) -> Path:
    """runtime_model exported to `directory` with `variants`, with parity (levels 1-3 and
    the variants' groups) on 24 random sources and no int8 gate limit, on one torch thread."""
    import torch

    from edgeseq.export.heldout import HeldOut
    from edgeseq.export.kinds.seq2seq.bundle import export_bundle
    from edgeseq.export.parity import random_sources
    from edgeseq.export.variants import VariantOptions

    held = HeldOut(random_sources(runtime_model.model, 24), None, "random sources")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        export_bundle(
            runtime_model.model, runtime_model.tokenizers, directory, held=held,
            task={"name": "reverse", "options": {}},
            variants=VariantOptions(variants, max_metric_drop=100.0, speed_inputs=4),
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return directory


@pytest.fixture(scope="session")
def steps_bundle(runtime_model: RuntimeCase, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runtime_model exported with the fp32, int8 and steps variants (`export_runtime_variants`)."""
    bundle = tmp_path_factory.mktemp("steps") / "reverse-steps"
    return export_runtime_variants(runtime_model, bundle, ("fp32", "int8", "steps"))


# -- imported models (issue 37): a MarianMT directory and an nn.Transformer, each exported once --
@pytest.fixture(scope="session")
def marian_import(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/import_cases.py's copy-trained tiny MarianMT, exported with every variant, gated
    on its --data TSV: {"source", "data", "bundle", "output"}."""
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    pytest.importorskip("sentencepiece", reason="the hf extra is not installed")
    from import_cases import export_marian

    return export_marian(tmp_path_factory.mktemp("marian-import"))


@pytest.fixture(scope="session")
def torch_import(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/import_cases.py's tutorial-shaped nn.Transformer model, exported with fp32, int8
    and search on its --data file: {"source", "data", "bundle", "output"}."""
    from import_cases import export_torch

    return export_torch(tmp_path_factory.mktemp("torch-import"))


# -- the in-place cache decoder (issue 38): runtime_model with fp32, int8 and inplace ---------
@pytest.fixture(scope="session")
def in_place_bundle(runtime_model: RuntimeCase, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runtime_model exported with the fp32, int8 and inplace variants
    (`export_runtime_variants`)."""
    bundle = tmp_path_factory.mktemp("inplace") / "reverse-inplace"
    return export_runtime_variants(runtime_model, bundle, ("fp32", "int8", "inplace"))


# -- issue 45's families (tests/family_cases.py): one copy-trained checkpoint each, exported
# once with every variant it has, gated on its --data TSV: {"source", "data", "bundle", "output"}
def _family_import(fixture: str, family: str) -> Any:
    """A session fixture called `fixture` exporting family_cases' `family`."""

    @pytest.fixture(scope="session", name=fixture)
    def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
        pytest.importorskip("transformers", reason="the hf extra is not installed")
        pytest.importorskip("sentencepiece", reason="the hf extra is not installed")
        from family_cases import export_family

        return export_family(family, tmp_path_factory.mktemp(f"{family}-import"))

    return imported


m2m_import = _family_import("m2m_import", "m2m_100")  # NLLB layout, target language forced
mbart50_import = _family_import("mbart50_import", "mbart-50")  # target language forced
bart_import = _family_import("bart_import", "bart")  # byte-level BPE, post-norm
t5_import = _family_import("t5_import", "t5")  # v1.1 / Flan-T5: relative position buckets
