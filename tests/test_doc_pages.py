"""The commands of the reference pages, run in page order as a reader runs them
(tests/doc_runner.py): every output a page shows must be what its command prints (timing
values ignored, `...` for any text), and every command must exit as the page implies.

- docs/import.md: the `torch.nn.Transformer` example (built by examples/torch_transformer,
  exported, generated, verified, refused, gated, benchmarked) and the tiny MarianMT (built by
  tests/hf_fixtures.py, exported, generated, verified).
- docs/export.md: trains the tiny `reverse` model (6 epochs, seed 0: the same weights each run
  on one machine), exports, verifies, inspects it (and a copy with one byte changed), exports
  its variants and a gate that fails, the shipped g2p-en with the search variant, and a GPT
  trained one epoch.
- docs/runtime.md: trains and exports the same `reverse` model (its first commands), generates
  from the CLI and the Python API, trains a GPT and a BERT one epoch each and runs them, and
  the providers' and built-in model's commands.
- docs/providers.md: the built-in g2p-en bundle with `--provider cuda` (refused: no usable GPU
  here), an invalid `EDGESEQ_PROVIDER`.
- docs/serve.md: exports the shipped g2p-en, starts `edgeseq serve` in the background, and
  runs the page's `curl` session against it (port 8000 replaced by a free one), then stops the
  server with SIGINT; exports the load test's steps bundle.
- docs/serve-translation.md: builds a tiny MarianMT and a tiny NLLB-layout model
  (tests/hf_fixtures.py, tests/m2m_fixtures.py), exports them for a CPU server (the NLLB one
  with `--target-lang`) and the Marian one for a GPU, serves both (ports 8080 and 8081
  replaced by free ones) and runs the page's `curl` requests; about 5 minutes on 2 cores.

The pages write under `/tmp/`; the test rewrites `/tmp/` to a `tmp/` of its own working
directory, outputs included. Every page runs in a directory of its own (BUILDS: the commands
at the top of each page that build what the page reads).

Not run: what a page marks `# not run here`: providers.md's CUDA-fallback warning (needs a GPU
that onnxruntime cannot use) and OpenVINO example; serve.md's API-key commands (they write
/run/secrets and serve on 0.0.0.0) and `benchmarks/serve_load.py` (up to 40 s per server and
round, 2 rounds: minutes; its table is a measurement, not a check). SKIP's commands, each with
its reason.

Times here, on 2 cores: runtime.md 4.3 minutes when the cores were otherwise idle (its three
trainings 97 s, 26 s and 63 s), export.md about 8 minutes with other jobs running, serve.md
70 s, providers.md 6 s, import.md about 12 minutes (three exports and two verifications, each
with the source model's own parity group; a benchmark). Other jobs on the cores make training
many times slower (the `reverse` training was at epoch 3 of 6 after 17 minutes under heavy
load), hence the 40-minute limit per command. So the pages are marked `docs` and run only with
EDGESEQ_DOCS_RUN=1 (`make test-docs`), not in `make test`. The guard test runs everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from doc_runner import Step, free_port, page_steps, run_steps
from test_readme import base_env

ROOT = Path(__file__).resolve().parents[1]
RUN_ENV = "EDGESEQ_DOCS_RUN"
# Each page's commands that the test does not run, with the reason.
SKIP = {
    "export.md": {},
    "providers.md": {},
    "runtime.md": {},
    "serve.md": {},
    "serve-translation.md": {},
    "import.md": {
        "pip install '.[train,hf]'": "an install (tests/test_readme.py runs the README's installs)",
    },
}
LINKED = ("tests", "examples", "models", "benchmarks")  # the repository's folders they read
# The first commands of each page: what they build is what the rest of the page reads.
TRAIN_REV = (
    "edgeseq train --task reverse --recipe models/recipes/tiny.json --out runs/rev"
    " --epochs 6 --quiet"
)
BUILDS = {
    "export.md": [TRAIN_REV, "edgeseq export runs/rev/best --out bundles/rev"],
    "runtime.md": [TRAIN_REV, "edgeseq export runs/rev/best --out bundles/rev"],
    "serve.md": ["edgeseq export models/g2p-en --out bundles/g2p-en"],
    "serve-translation.md": [
        "python -c \"import sys; sys.path.insert(0, 'tests'); from hf_fixtures import "
        "build_marian_dir; build_marian_dir('opus-mt-en-de', copy_steps=400)\"",
        "python -c \"import sys; sys.path.insert(0, 'tests'); from m2m_fixtures import "
        "build_m2m_dir; build_m2m_dir('nllb-200-distilled-600M', copy_steps=200)\"",
    ],
}
# serve-translation.md's two servers, with the option the page is about.
TRANSLATION_SERVERS = [
    "edgeseq serve bundles/opus-mt-en-de --variant int8 --port 8080",
    "edgeseq serve bundles/nllb --variant int8 --target-lang fra_Latn --port 8081",
]
SERVER = "edgeseq serve bundles/g2p-en --provider cpu"  # serve.md's; on port 8000 as written


def steps_of(page: str) -> list[Step]:
    return page_steps(page, (ROOT / "docs" / page).read_text(encoding="utf-8"))


def test_every_skipped_command_is_on_its_page_and_the_pages_have_steps() -> None:
    """A guard for the test below: a SKIP entry the page lost, or a page with nothing to run,
    would make it pass without checking anything."""
    for page, skipped in SKIP.items():
        commands = {s.text for s in steps_of(page)}
        assert sorted(set(skipped) - commands) == [], f"{page} no longer has these commands"
    later = page_steps("p.md", "```\n$ a\nout\n```\n\ntext\n\n```\nsynopsis\n```\n")
    assert [s.output for s in later] == [["out"]]  # a later block is not a command's output
    import_steps = steps_of("import.md")
    assert len([s for s in import_steps if s.output]) >= 8
    assert any("<<'EOF'" in s.text and s.text.endswith("\nEOF") for s in import_steps)
    for page, builds in BUILDS.items():  # each page builds what its other commands read
        run = [s for s in steps_of(page) if not s.skip and s.text not in SKIP[page]]
        assert len([s for s in run if s.output]) >= 8, page
        assert [s.text for s in run[: len(builds)]] == builds, page
    serve = [s for s in steps_of("serve.md") if not s.skip]
    assert [s.text for s in serve if s.background] == [SERVER]
    assert all("localhost:8000" in s.text for s in serve if s.text.startswith("curl"))
    translation = [s for s in steps_of("serve-translation.md") if not s.skip]
    assert [s.text for s in translation if s.background] == TRANSLATION_SERVERS
    requests = [s.text for s in translation if s.text.startswith("curl")]
    assert any("8081" in r and '"target_lang"' in r for r in requests)
    assert any("8081" in r and "target_lang" not in r for r in requests)
    assert any("--target-lang fra_Latn" in s.text for s in translation if "export" in s.text)


@pytest.mark.docs
@pytest.mark.skipif(
    os.environ.get(RUN_ENV) != "1", reason=f"{RUN_ENV}=1 runs the pages' commands (minutes)"
)
@pytest.mark.parametrize("page", sorted(SKIP))
def test_a_page_gives_what_it_shows(page: str, tmp_path: Path) -> None:
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "tmp").mkdir()
    steps = [s for s in steps_of(page) if s.text not in SKIP[page]]
    replace = {"/tmp/": f"{tmp_path}/tmp/"}
    if page == "serve.md":  # a free port instead of 8000, so that parallel runs do not collide
        port = free_port()
        replace |= {SERVER: f"{SERVER} --port {port}", ":8000": f":{port}"}
    if page == "serve-translation.md":
        ports = [free_port(), free_port()]
        while ports[1] == ports[0]:
            ports[1] = free_port()
        for old, port in zip(("8080", "8081"), ports, strict=True):
            replace |= {f"--port {old}": f"--port {port}", f":{old}": f":{port}"}
    assert run_steps(steps, tmp_path, base_env(), replace, timeout=2400) == []
