"""bench/memory_peak.py: the allocator's peak replayed from a snapshot's end state and its
history, the blocks live at that moment grouped by the op that allocated them, and the most
each op saw allocated."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from memory_peak import peak_blocks, table

GiB = 2**30


def _snapshot() -> dict:
    """Weights (2 GiB) live throughout; the backward allocates 3 GiB and 1 GiB, frees the
    3 GiB; the optimizer then allocates 1 GiB. A stackless snapshot: no `addr` on blocks."""
    trace = [
        {"action": "alloc", "addr": 0, "size": 2 * GiB, "user_metadata": ""},
        {"action": "alloc", "addr": 2 * GiB, "size": 3 * GiB, "user_metadata": "train.backward"},
        {"action": "alloc", "addr": 5 * GiB, "size": GiB, "user_metadata": "train.backward"},
        {"action": "free_requested", "addr": 2 * GiB, "size": 3 * GiB, "user_metadata": ""},
        {"action": "free_completed", "addr": 2 * GiB, "size": 3 * GiB, "user_metadata": ""},
        {"action": "alloc", "addr": 2 * GiB, "size": GiB, "user_metadata": "update.optimizer"},
    ]
    blocks = [
        {"size": 2 * GiB, "state": "active_allocated", "user_metadata": ""},
        {"size": GiB, "state": "active_allocated", "user_metadata": "update.optimizer"},
        {"size": 2 * GiB, "state": "inactive"},
        {"size": GiB, "state": "active_allocated", "user_metadata": "train.backward"},
    ]
    return {"segments": [{"device": 0, "address": 0, "blocks": blocks}], "device_traces": [trace]}


def test_peak_is_replayed_with_the_blocks_live_then() -> None:
    by_op: dict[str, int] = {}
    peak, live = peak_blocks(_snapshot(), by_op=by_op)
    assert peak == 6 * GiB  # weights + both backward blocks, before the 3 GiB free
    assert sorted(b.size for b in live.values()) == [GiB, 2 * GiB, 3 * GiB]
    # the optimizer's block came after the peak; the freed 3 GiB keeps its allocating op
    assert {b.op for b in live.values()} == {"", "train.backward"}
    assert by_op == {"(untagged)": 2 * GiB, "train.backward": 6 * GiB, "update.optimizer": 4 * GiB}


def test_blocks_live_at_the_end_take_their_allocs_op() -> None:
    """torch 2.11's segments carry no `user_metadata`: a block still live at the end is
    named by its alloc in the trace (the weights, allocated before any op, stay untagged)."""
    snapshot = _snapshot()
    for b in snapshot["segments"][0]["blocks"]:
        b.pop("user_metadata", None)
    by_op: dict[str, int] = {}
    _, live = peak_blocks(snapshot, by_op=by_op)
    assert sorted((b.op, b.size) for b in live.values()) == [
        ("", 2 * GiB), ("train.backward", GiB), ("train.backward", 3 * GiB)
    ]  # fmt: skip
    assert by_op == {"(untagged)": 2 * GiB, "train.backward": 6 * GiB, "update.optimizer": 4 * GiB}


def test_blocks_are_grouped_by_op_and_size_class() -> None:
    _, live = peak_blocks(_snapshot())
    rows = {where: (size, count) for where, size, count in table(live, top=10)}
    assert rows == {
        "train.backward (3,072 MiB blocks)": (3 * GiB, 1),
        "(untagged) (2,048 MiB blocks)": (2 * GiB, 1),
        "train.backward (1,024 MiB blocks)": (GiB, 1),
    }
