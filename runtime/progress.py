"""Progress bars (tqdm) on stderr, shown only when stderr is a terminal.

    with progress_bar(total=len(lines), unit="line", desc="generate") as bar:
        bar.update(len(batch))

Piped or redirected stderr (scripts, CI, tests) gets no bar and no carriage returns.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def stderr_is_terminal() -> bool:
    """Whether stderr is an interactive terminal."""
    return bool(getattr(sys.stderr, "isatty", None)) and sys.stderr.isatty()


def progress_bar(total: int, unit: str, desc: str, **kwargs: Any) -> tqdm:
    """A tqdm bar over `total` units on stderr, disabled unless stderr is a terminal."""
    return tqdm(
        total=total, unit=unit, desc=desc, file=sys.stderr, disable=not stderr_is_terminal(),
        leave=False, dynamic_ncols=True, **kwargs,
    )  # fmt: skip
