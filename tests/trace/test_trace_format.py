"""The hard rules of torch-tb-profiler 0.4.3's trace format (FACTS.md), checked on our files."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from rollplex.trace import Span, Timeline, build_profiler_trace, write_profiler_traces
from rollplex.trace.profiler_trace import HOST_PID

PLUGIN_FILE_RE = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(\.gz)?$")
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _load(paths: list[Path]) -> dict[str, dict]:
    return {PLUGIN_FILE_RE.match(p.name).group(1): json.loads(p.read_text()) for p in paths}


@pytest.fixture
def traces(timeline: Timeline, tmp_path: Path) -> dict[str, dict]:
    return _load(write_profiler_traces(timeline, tmp_path / "run"))


def _x(trace: dict, **match: object) -> list[dict]:
    evs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    return [e for e in evs if all(e.get(k) == v for k, v in match.items())]


def _overlap(a: dict, b: dict) -> bool:
    return a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]


def _assert_nested(events: list[dict]) -> None:
    """Events of one lane must be disjoint or nested, as the plugin's tree builder needs."""
    open_ends: list[float] = []
    for e in sorted(events, key=lambda e: (e["ts"], -(e["ts"] + e["dur"]))):
        start, end = e["ts"], e["ts"] + e["dur"]
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        assert not open_ends or end <= open_ends[-1], f"{e['name']} crosses its parent"
        open_ends.append(end)


def test_one_file_per_device_named_for_the_plugin(timeline: Timeline, tmp_path: Path) -> None:
    paths = write_profiler_traces(timeline, tmp_path / "run")
    assert [PLUGIN_FILE_RE.match(p.name).group(1) for p in paths] == ["gpu0", "gpu1"]
    assert all(PLUGIN_FILE_RE.match(p.name).group(2) for p in paths)  # span digits present
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(p.name for p in paths)


def test_every_event_named_and_every_x_event_has_cat(traces: dict[str, dict]) -> None:
    for trace in traces.values():
        assert trace["traceEvents"]
        for e in trace["traceEvents"]:
            assert isinstance(e.get("name"), str) and e["name"], e
            if e["ph"] == "X":
                assert isinstance(e.get("cat"), str) and e["cat"], e


def test_device_events_carry_device_equal_to_pid(traces: dict[str, dict]) -> None:
    for worker, trace in traces.items():
        dev = [e for e in _x(trace) if e["cat"] in DEVICE_CATS]
        assert dev
        for e in dev:
            assert type(e["args"]["device"]) is int
            assert e["args"]["device"] == e["pid"] == int(worker[3:]) < 64


def test_trace_events_last_and_survive_the_counter_splice(traces: dict, tmp_path: Path) -> None:
    for path in sorted((tmp_path / "run").glob("*.pt.trace.json")):
        raw = path.read_bytes()
        keys = list(json.loads(raw))
        assert keys[-1] == "traceEvents"
        assert keys.index("deviceProperties") < keys.index("traceEvents")
        # What the plugin's Trace view does (RunProfile.append_gpu_metrics).
        counter = b'{"ph":"C","name":"GPU 0 Utilization","pid":0,"ts":1,"args":{"v":1}}'
        spliced = raw[: raw.rfind(b"]")] + b", " + counter + b"]}"
        events = json.loads(spliced)["traceEvents"]
        assert events[-1]["ph"] == "C"
        assert len(events) == len(json.loads(raw)["traceEvents"]) + 1


def test_device_properties_indexable_by_device_id(traces: dict, timeline: Timeline) -> None:
    for worker, trace in traces.items():
        props = trace["deviceProperties"][int(worker[3:])]
        assert props["name"] == timeline.device_name
        assert props["totalGlobalMem"] == timeline.device_memory_bytes


def test_one_profiler_step_per_rl_step(traces: dict, timeline: Timeline) -> None:
    for trace in traces.values():
        steps = [e for e in _x(trace, cat="user_annotation") if e["name"].startswith("Profiler")]
        assert [e["name"] for e in steps] == [f"ProfilerStep#{k}" for k in range(2)]
        assert [(e["ts"], e["ts"] + e["dur"]) for e in steps] == timeline.steps
        assert {e["pid"] for e in steps} == {HOST_PID}


def test_host_lanes_nest_and_streams_get_their_own(traces: dict, timeline: Timeline) -> None:
    for trace in traces.values():
        lanes = defaultdict(list)
        for e in _x(trace, pid=HOST_PID):
            lanes[e["tid"]].append(e)
        for events in lanes.values():
            _assert_nested(events)
        ops = _x(trace, cat="cpu_op")
        op_streams = defaultdict(set)
        for e in ops:
            op_streams[e["tid"]].add(e["args"]["stream"])
        assert all(len(s) == 1 for s in op_streams.values())  # one stream per host lane
        assert len(op_streams) == 3


def test_overlapping_spans_on_other_streams_all_shown(traces: dict, timeline: Timeline) -> None:
    for worker, trace in traces.items():
        device = int(worker[3:])
        mine = [s for s in timeline.spans if s.device == device and s.cat == "kernel"]
        want = sorted((s.name, s.stream, s.start_us, s.dur_us) for s in mine)
        kernels = _x(trace, cat="kernel")
        assert sorted((e["name"], e["tid"], e["ts"], e["dur"]) for e in kernels) == want
        decode = [e for e in kernels if e["name"] == "decode"]
        others = [e for e in kernels if e["tid"] != decode[0]["tid"]]
        overlapping = [o for o in others for d in decode if _overlap(o, d)]
        assert overlapping, "the fixture must overlap decode with work on other streams"


def test_streams_named_by_metadata(traces: dict) -> None:
    for worker, trace in traces.items():
        meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
        names = {
            (e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"
        }
        device = int(worker[3:])
        assert names[(device, 7)] == "stream 7 (decode)"
        assert names[(device, 13)] == "stream 13 (prefix)"
        assert "host: stream 20 (train)" in names.values()


def test_launches_correlate_kernels_with_host_ops(traces: dict) -> None:
    for trace in traces.values():
        runtime = {e["args"]["correlation"]: e for e in _x(trace, cat="runtime")}
        ops = {e["args"]["External id"]: e for e in _x(trace, cat="cpu_op")}
        for k in _x(trace, cat="kernel"):
            rt = runtime[k["args"]["correlation"]]
            op = ops[rt["args"]["External id"]]
            assert k["args"]["External id"] == rt["args"]["External id"]
            assert (op["name"], op["tid"], op["ts"]) == (k["name"], rt["tid"], k["ts"])


def test_memory_events(traces: dict, timeline: Timeline) -> None:
    for worker, trace in traces.items():
        device = int(worker[3:])
        mem = [e for e in trace["traceEvents"] if e["name"] == "[memory]"]
        want = [m for m in timeline.memory if m.device == device]
        assert len(mem) == len(want)
        for e, m in zip(mem, want, strict=True):
            assert e["ph"] == "i"
            assert e["args"] == {
                "Device Type": 1,
                "Device Id": device,
                "Addr": m.addr,
                "Bytes": m.delta_bytes,
                "Total Allocated": m.total_allocated,
                "Total Reserved": m.total_reserved,
            }
        # A named allocation sits on the host lane of the op that made it.
        lane_of_op = {(e["name"], e["ts"]): e["tid"] for e in _x(trace, cat="cpu_op")}
        first = mem[0]
        assert first["tid"] in {t for (name, _), t in lane_of_op.items() if name == "decode"}


def test_same_stream_overlap_goes_to_an_overflow_lane(tmp_path: Path) -> None:
    spans = [Span(0, 3, "a", 0, 100), Span(0, 3, "b", 50, 100), Span(0, 3, "c", 60, 10)]
    tl = Timeline("x", spans, [], [(0, 200)], {(0, 3): "copy"})
    trace = build_profiler_trace(tl, 0)
    kernels = {e["name"]: e["tid"] for e in _x(trace, cat="kernel")}
    assert kernels["a"] != kernels["b"]  # b crosses a's end: it cannot share a's lane
    assert len(kernels) == 3
    for tid in {e["tid"] for e in _x(trace, pid=HOST_PID)}:
        _assert_nested(_x(trace, pid=HOST_PID, tid=tid))
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert "stream 3 (copy) [overlap 1]" in names


def test_without_steps_one_step_covers_everything() -> None:
    tl = Timeline("x", [Span(2, 0, "k", 10, 5)], [], [], {})
    trace = build_profiler_trace(tl, 2)
    (step,) = [e for e in _x(trace) if e["name"].startswith("ProfilerStep#")]
    assert (step["ts"], step["ts"] + step["dur"]) == (10, 15)
    assert len(trace["deviceProperties"]) == 3
    assert "totalGlobalMem" not in trace["deviceProperties"][2]  # unknown: plugin divides by it


@pytest.mark.parametrize(
    "bad",
    [
        Timeline("x", [Span(64, 0, "k", 0, 1)], [], [], {}),
        Timeline("x", [Span(0, 0, "", 0, 1)], [], [], {}),
        Timeline("x", [Span(0, 0, "k", 0, -1)], [], [], {}),
        Timeline("x", [Span(0, 0, "k", 0, 1)], [], [(5, 5)], {}),
    ],
)
def test_rejects_what_the_plugin_cannot_load(bad: Timeline, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_profiler_traces(bad, tmp_path)
    assert not list(tmp_path.iterdir())
