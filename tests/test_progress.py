"""Progress bars appear on stderr only when it is a terminal."""

from __future__ import annotations

import pytest

from edgeseq.runtime import progress


def _run(total: int | None, **kwargs) -> None:
    with progress.progress_bar(total, "src", "evaluate", mininterval=0, **kwargs) as bar:
        for _ in range(3):
            bar.update(1)


def test_bar_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: False)
    _run(3)
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    _run(3)
    out, err = capsys.readouterr()
    assert out == "" and "evaluate" in err and "3/3" in err
    _run(None, disable=True)
    assert capsys.readouterr() == ("", "")
