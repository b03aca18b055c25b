"""A value made on first use, once, under a lock: graph sessions a process may never use.

    in_place = Lazy(lambda: open_graph_variant(bundle, "inplace", "fp32", providers))
    in_place.opened          # False: nothing loaded yet
    in_place.get()           # the session (made now, by one thread; the others wait for it)

A failure is raised to the caller and not remembered: the next `get` tries again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Lazy(Generic[T]):
    """`make()`'s result, made by the first `get` (thread-safe)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._value: T | None = None
        self._made = False

    @property
    def opened(self) -> bool:
        """Whether the value was made."""
        return self._made

    def get(self) -> T:
        """The value, made now if this is the first call."""
        if not self._made:
            with self._lock:
                if not self._made:
                    self._value = self._make()
                    self._made = True
        return self._value  # type: ignore[return-value]
