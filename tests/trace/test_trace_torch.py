"""A torch.profiler-shaped trace: memory inside a plan step's range is named by that step
(even inside an aten op, even with no op around it); memory outside stays where it was."""

from __future__ import annotations

import pytest

from rollplex.trace.torch_trace import PLAN_TID, attribute_to_steps

PID, TID = 77, 4242


def _mem(ts: float, nbytes: int, addr: int) -> dict:
    args = {"Device Type": 0, "Device Id": -1, "Addr": addr, "Bytes": nbytes}
    args |= {"Total Allocated": max(nbytes, 0), "Total Reserved": 0}
    return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID,
            "tid": TID, "ts": ts, "args": args}  # fmt: skip


def _x(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur,
            "args": {}}  # fmt: skip


def _trace() -> dict:
    return {
        "traceEvents": [
            _x("user_annotation", "ProfilerStep#0", 0, 30),
            _x("user_annotation", "decode", 1, 10),
            _x("cpu_op", "aten::mm", 2, 3),
            _mem(3, 100, 1),  # inside aten::mm inside decode
            _mem(8, 50, 2),  # inside decode, no op around it
            _x("user_annotation", "backward", 12, 10),
            _mem(14, -100, 1),
            _mem(25, 7, 3),  # after every step
        ],
        "deviceProperties": [],
    }


def test_memory_in_a_step_moves_to_the_plan_lane_and_the_rest_stays():
    out = attribute_to_steps(_trace(), {"decode", "backward"}, [("decode", 0, "why")])
    assert list(out)[-1] == "traceEvents"
    mem = {e["ts"]: e["tid"] for e in out["traceEvents"] if e["name"] == "[memory]"}
    assert mem == {3: PLAN_TID, 8: PLAN_TID, 14: PLAN_TID, 25: TID}
    ops = [(e["name"], e["ts"]) for e in out["traceEvents"] if e.get("tid") == PLAN_TID]
    assert ("decode", 1) in ops and ("backward", 12) in ops
    (mark,) = [e for e in out["traceEvents"] if e["name"] == "plan not followed"]
    assert (mark["ts"], mark["args"]["text"]) == (11, "why")


def test_the_plugin_names_the_step():
    pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    for trace, want in (
        (_trace(), {"aten::mm": 100, "<unknown>": 57}),
        (attribute_to_steps(_trace(), {"decode", "backward"}), {"decode": 150, "<unknown>": 7}),
    ):
        data = RunProfileData.from_json("w", 1, trace)
        profile = RunGenerator("w", 1, data).generate_run_profile()
        got: dict[str, int] = {}
        for r in profile.memory_snapshot.memory_records:
            if r.bytes > 0:
                got[r.op_name_or_unknown] = got.get(r.op_name_or_unknown, 0) + r.bytes
        assert got == want


def test_a_trace_without_plan_steps_is_refused():
    with pytest.raises(ValueError, match="no plan step"):
        attribute_to_steps(_trace(), {"prefill"})
