"""One-time phases of a run (model load, a first compilation, a CUDA-graph capture), each
logged once with its duration, and the innermost running one told to watchers (the progress
bar), so a minute of compiling does not look like a hang. Standard logging only.

    with phase("model load"):
        ...
    fn = first_call(torch.compile(fn), "compile decode layer")  # times only the first call
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Watcher = Callable[[str | None], None]  # told the innermost running phase (None: none)


@dataclass(slots=True, frozen=True)
class PhaseRecord:
    name: str
    seconds: float


_watchers: list[Watcher] = []
_running: list[str] = []
_records: list[PhaseRecord] = []


def _tell() -> None:
    current = _running[-1] if _running else None
    for watcher in list(_watchers):
        watcher(current)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Run the body as the phase `name`: watchers see it while it runs, and one log line
    gives its duration (also when it raises)."""
    _running.append(name)
    _tell()
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - start
        _running.remove(name)
        _records.append(PhaseRecord(name, seconds))
        log.info("%s: %.1f s", name, seconds)
        _tell()


class FirstCall:
    """`fn`, whose first call runs as a phase; later calls go straight through."""

    __slots__ = ("done", "fn", "name")

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn, self.name, self.done = fn, name, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.done:
            return self.fn(*args, **kwargs)
        self.done = True
        with phase(self.name):
            return self.fn(*args, **kwargs)


def first_call(fn: Callable[..., Any], name: str) -> FirstCall:
    """`fn` whose first call (where torch.compile compiles) runs as the phase `name`."""
    return FirstCall(fn, name)


@contextmanager
def watching(watcher: Watcher) -> Iterator[None]:
    """Tell `watcher` the running phase from now until the block ends."""
    _watchers.append(watcher)
    try:
        yield
    finally:
        _watchers.remove(watcher)


def watch(watcher: Watcher) -> Callable[[], None]:
    """`watching` for an object that lives longer than a block; returns the unwatch."""
    _watchers.append(watcher)
    return lambda: _watchers.remove(watcher) if watcher in _watchers else None


def records(since: int = 0) -> list[PhaseRecord]:
    """Phases ended in this process, oldest first, from index `since` (`mark()`)."""
    return list(_records[since:])


def mark() -> int:
    """Where this run's phases start in `records` (a process may run several jobs)."""
    return len(_records)


def first_forward(module: Any, name: str) -> Any:
    """`module` (a torch nn.Module) whose first forward runs as the phase `name` (an
    in-place `module.compile()` compiles there); the hooks remove themselves after it."""
    scope: list[Any] = []

    def enter(*_: Any) -> None:
        scope.append(phase(name))
        scope[-1].__enter__()

    def leave(*_: Any) -> None:
        pre.remove()
        post.remove()
        if scope:
            scope.pop().__exit__(None, None, None)

    pre = module.register_forward_pre_hook(enter)
    post = module.register_forward_hook(leave, always_call=True)
    return module
