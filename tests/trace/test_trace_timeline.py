"""The backend-neutral timeline model."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from rollplex.trace import MemoryEvent, Span, Timeline


def _tl() -> Timeline:
    spans = [Span(3, 0, "a", 10, 5, args={"k": 1}), Span(1, 2, "b", 0, 40)]
    memory = [MemoryEvent(5, 60, 0x10, 64, 64, 128)]
    return Timeline("p", spans, memory, [(0, 50)], {(1, 2): "decode"})


def test_devices_and_end() -> None:
    tl = _tl()
    assert tl.devices() == [1, 3, 5]  # memory-only devices count too
    assert tl.end_us() == 60
    assert Timeline("empty", [], [], [], {}).end_us() == 0.0


def test_shifted_moves_every_time_and_leaves_the_original() -> None:
    tl = _tl()
    moved = tl.shifted(100.0)
    assert [s.start_us for s in moved.spans] == [110, 100]
    assert [s.dur_us for s in moved.spans] == [5, 40]
    assert moved.memory[0].t_us == 160 and moved.steps == [(100, 150)]
    assert moved.end_us() == tl.end_us() + 100
    moved.spans[0].args["k"] = 2
    assert tl.spans[0].args == {"k": 1} and tl.spans[0].start_us == 10


@pytest.mark.parametrize("cls", [Span, MemoryEvent, Timeline])
def test_records_are_slotted(cls: type) -> None:
    assert dataclasses.is_dataclass(cls) and hasattr(cls, "__slots__")


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, rollplex.trace; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
