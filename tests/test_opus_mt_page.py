"""docs/opus-mt.md, run as a reader runs it: every command in page order in one temporary
directory (with the repository's tests/ linked in, for the page's model builder), the server in
the background and `curl` against it, every output the page shows compared with what ran
(timing values ignored). The download is marked `# not run here` on the page and skipped.

About 40 s (a 10 s model build, a 15 s export, a server): marked `slow`, inside `make test`.
The page's port 8080 is replaced by a free one, so that parallel runs do not collide.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from doc_runner import Step, free_port, mismatch, page_steps, run_steps
from test_readme import base_env

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "opus-mt.md"
STEPS = page_steps(PAGE.name, PAGE.read_text(encoding="utf-8"))


def test_the_page_has_the_steps_a_user_needs() -> None:
    """A guard for the test below: the download skipped, the rest found, a server started."""
    [download] = [s for s in STEPS if s.skip]
    assert download.kind == "python" and "from_pretrained" in download.text
    commands = [s.text for s in STEPS if s.kind == "shell"]
    for needed in ("build_marian_dir", "edgeseq export", "--data heldout.tsv", "edgeseq serve",
                   "curl", "--split-sentences", "--truncate", "sort -n"):  # fmt: skip
        assert any(needed in c for c in commands), needed
    assert [s.text.split()[1] for s in STEPS if s.background] == ["serve"]
    assert all(s.output for s in STEPS if s.text.startswith(("edgeseq generate", "curl")))


def test_the_comparison_finds_wrong_outputs_and_exit_codes() -> None:
    """A guard for the runner: timing values are ignored, nothing else is."""
    step = Step("p.md:1", "shell", "x", ["[  1.5s] wrote b (2.0 s)", "...", "ok 2.7e-06"])
    assert mismatch(step, 0, "[ 12.0s] wrote b (0.1 s)\nmore\nok 3.1e-06\n", "") is None
    assert mismatch(step, 0, "[ 12.0s] wrote b (0.1 s)\nmore\nfailed 3.1e-06\n", "") is not None
    assert mismatch(step, 0, "[ 12.0s] wrote c (0.1 s)\nok 1.0e-06\n", "") is not None
    assert mismatch(step, 1, "[ 1.0s] wrote b (1 s)\nok 1.0e-06\n", "") is not None
    failing = Step("p.md:2", "shell", "x", ["error: no such file"])
    assert mismatch(failing, 1, "", "error: no such file\n") is None
    assert mismatch(failing, 0, "", "error: no such file\n") is not None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="the page's requests need curl")
def test_every_command_of_the_page_gives_what_it_shows(tmp_path: Path) -> None:
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    port = str(free_port())
    replace = {":8080": f":{port}", "--port 8080": f"--port {port}"}
    assert run_steps(STEPS, tmp_path, base_env(), replace) == []
