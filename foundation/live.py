"""Child servers a process has started and not yet stopped, stopped together when the process exits."""

from __future__ import annotations

import atexit
import threading
from typing import Protocol


class Stoppable(Protocol):
    def stop(self) -> None: ...


class LiveSet:
    """The servers of one kind this process started and has not stopped yet; every one is stopped at exit."""

    def __init__(self) -> None:
        self._items: set[Stoppable] = set()
        self._lock = threading.Lock()
        atexit.register(self.stop_all)

    def add(self, item: Stoppable) -> None:
        with self._lock:
            self._items.add(item)

    def discard(self, item: Stoppable) -> None:
        with self._lock:
            self._items.discard(item)

    def stop_all(self) -> int:
        """Stop every live server; returns how many there were."""
        with self._lock:
            items = list(self._items)
        for item in items:
            item.stop()
        return len(items)
