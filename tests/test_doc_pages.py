"""The commands of the reference pages, run in page order as a reader runs them
(tests/doc_runner.py): every output a page shows must be what its command prints (timing
values ignored, `...` for any text), and every command must exit as the page implies.

- docs/import.md: the `torch.nn.Transformer` example (built by examples/torch_transformer,
  exported, generated, verified, refused, gated, benchmarked) and the tiny MarianMT (built by
  tests/hf_fixtures.py, exported, generated, verified). The pages write under `/tmp/`; the test
  rewrites `/tmp/` to a `tmp/` of its own working directory, outputs included.

Not run: what the page marks `# not run here`, and SKIP's commands, each with its reason.
docs/export.md, docs/runtime.md and docs/serve.md are not run yet: their outputs come from a
trained `reverse` model and an exported g2p-en bundle, minutes of training and export each.

import.md takes about 12 minutes on 2 busy cores (three exports and two verifications, each
with the source model's own parity group; a benchmark): marked `docs` and run only with
EDGESEQ_DOCS_RUN=1 (`make test-docs`), not in `make test`. The guard test runs everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from doc_runner import Step, page_steps, run_steps
from test_readme import base_env

ROOT = Path(__file__).resolve().parents[1]
RUN_ENV = "EDGESEQ_DOCS_RUN"
# Each page's commands that the test does not run, with the reason.
SKIP = {
    "import.md": {
        "pip install '.[train,hf]'": "an install (tests/test_readme.py runs the README's installs)",
    },
}
LINKED = ("tests", "examples", "models")  # the repository's folders the pages' commands read


def steps_of(page: str) -> list[Step]:
    return page_steps(page, (ROOT / "docs" / page).read_text(encoding="utf-8"))


def test_every_skipped_command_is_on_its_page_and_the_pages_have_steps() -> None:
    """A guard for the test below: a SKIP entry the page lost, or a page with nothing to run,
    would make it pass without checking anything."""
    for page, skipped in SKIP.items():
        commands = {s.text for s in steps_of(page)}
        assert sorted(set(skipped) - commands) == [], f"{page} no longer has these commands"
    import_steps = steps_of("import.md")
    assert len([s for s in import_steps if s.output]) >= 8
    assert any("<<'EOF'" in s.text and s.text.endswith("\nEOF") for s in import_steps)


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
    assert run_steps(steps, tmp_path, base_env(), replace, timeout=900) == []
