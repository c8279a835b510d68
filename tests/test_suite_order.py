"""tests/conftest.py's heavy_files_first: whole files, most slow tests first, then most
tests; a file's own order kept (its module fixtures rely on it); ties keep collection order."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from tests.conftest import heavy_files_first


@dataclass
class Item:
    nodeid: str
    keywords: set[str] = field(default_factory=set)


def items(spec: list[tuple[str, str, bool]]) -> list[Item]:
    return [Item(f"{f}::{t}", {"slow"} if slow else set()) for f, t, slow in spec]


@pytest.mark.parametrize("reverse", [False, True])
def test_slow_files_first_then_big_files_and_each_file_in_its_own_order(reverse):
    spec = [
        ("a.py", "t1", False), ("a.py", "t2", False), ("a.py", "t3", False),
        ("b.py", "t1", True),
        ("c.py", "t2", False), ("c.py", "t1", True), ("c.py", "t0", True),
        ("d.py", "t1", False),
        ("e.py", "t1", False), ("e.py", "t2", False), ("e.py", "t3", False),
    ]  # fmt: skip
    got = items(spec[::-1] if reverse else spec)
    heavy_files_first(got)
    files = list(dict.fromkeys(i.nodeid.split("::")[0] for i in got))
    # c: 2 slow; b: 1 slow; then by test count, a tie kept in collection order
    assert files == (["c.py", "b.py", "e.py", "a.py", "d.py"] if reverse else
                     ["c.py", "b.py", "a.py", "e.py", "d.py"])  # fmt: skip
    want_c = ["c.py::t2", "c.py::t1", "c.py::t0"]
    assert [i.nodeid for i in got if i.nodeid.startswith("c.py")] == (
        want_c[::-1] if reverse else want_c
    )
    assert len(got) == len(spec)
    # contiguous: a file's tests are never split around another's
    runs = [i.nodeid.split("::")[0] for i in got]
    assert sum(a != b for a, b in itertools.pairwise(runs)) == len(files) - 1


def test_the_makefile_keeps_the_order():
    """xdist's own reorder (by test count) would undo it."""
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if "-m pytest" in x)
    assert "--dist loadfile" in line and "--no-loadscope-reorder" in line
