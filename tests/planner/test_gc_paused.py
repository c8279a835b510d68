"""The cyclic garbage collector paused for a block and left as it was found."""

from __future__ import annotations

import gc

import pytest

from rollplex.planner.gc_paused import cyclic_gc_paused


def test_the_collector_is_paused_inside_and_restored_after():
    """As the planner (and the decode engine's graph capture) use it."""
    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(ValueError), cyclic_gc_paused():
            raise ValueError
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()
    with pytest.raises(ValueError), cyclic_gc_paused():
        raise ValueError
    assert gc.isenabled()
