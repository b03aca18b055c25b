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


def progress_bar(
    total: int | None, unit: str, desc: str, disable: bool = False, **kwargs: Any
) -> tqdm:
    """A tqdm bar over `total` units (None: a counter) on stderr; disabled when `disable` or
    when stderr is not a terminal."""
    return tqdm(
        total=total, unit=unit, desc=desc, file=sys.stderr,
        disable=disable or not stderr_is_terminal(), leave=False, dynamic_ncols=True, **kwargs,
    )  # fmt: skip
