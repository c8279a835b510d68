"""Suite-wide: GPU tests skip themselves without CUDA, saying so; files with slow tests
are collected first, so that `--dist loadfile` hands them out first; every test leaves the
root logger as it found it; Inductor compiles in the process that asks."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator

import pytest
import torch

# Inductor's default on this 2-core machine is a pool of 2 compile workers per compiling
# process, each paying torch's imports: compiling in the process itself saves ~8 of a
# compile test's ~70 CPU-s (children started by tests inherit it).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy_files_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; run through the GPU machine (bench/README.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def heavy_files_first(items: list[pytest.Item]) -> None:
    """Order whole files by how many `slow` tests they hold, then by how many tests, most
    first; a file's own order is kept (its module fixtures see what they saw).

    `--dist loadfile` gives the workers files in collection order (the Makefile turns off
    xdist's reorder by test count, which put a file of one 80 s test last, where it ran
    alone while the other worker idled): longest first is what packs whole files onto a
    few workers best, and `slow` (any test over ~20 s) is the cost the suite knows of."""
    slow, count = Counter[str](), Counter[str]()
    for item in items:
        count[item.nodeid.split("::")[0]] += 1
        slow[item.nodeid.split("::")[0]] += "slow" in item.keywords
    rank = {f: (-slow[f], -count[f], i) for i, f in enumerate(count)}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


@pytest.fixture(autouse=True)
def root_logging_kept() -> Iterator[None]:
    """A CLI job run in this process lets Hydra give the root logger handlers on the test's
    captured streams, which close with the test: a later test's log line would then print
    a "Logging error" traceback into its own captured stderr. A verbose run also lowers the
    rollplex logger's level, which would let a later test capture lines it does not expect.
    Each test leaves the root and rollplex loggers' handlers and levels as it found them."""
    loggers = [logging.getLogger(), logging.getLogger("rollplex")]
    kept = [(list(logger.handlers), logger.level) for logger in loggers]
    yield
    for logger, (handlers, level) in zip(loggers, kept, strict=True):
        logger.handlers[:] = handlers
        logger.setLevel(level)
