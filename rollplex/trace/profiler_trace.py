"""Export a Timeline as Kineto-style traces that torch-tb-profiler 0.4.3 loads (FACTS.md).

One file per device (worker `gpu<N>`): a device lane per stream, and on the host a
`ProfilerStep#N` lane plus one lane per stream holding a 1 ns launch `cpu_op` per device span
(ops on one host thread must nest). Memory instants sit in the op that made them; marks are
instants on their stream. The plugin's constraints: docs/architecture.md (Trace).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from rollplex.trace._lanes import pack
from rollplex.trace.timeline import Span, Timeline

# Device categories and the runtime call that launches each.
DEVICE_CATS = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync"}
DEVICE_CATS["gpu_memset"] = "cudaMemsetAsync"
MAX_DEVICES = 64  # torch_tb_profiler.consts.MAX_GPU_PER_NODE
OVERFLOW_TID = 100_000  # device tid of overflow lane k of stream s: k * OVERFLOW_TID + s
HOST_PID = 1_000_000  # any pid that is not a device id
LAUNCH_US = 0.001  # runtime events are (nearly) free: the timeline has no launch cost
DEVICE_TYPE_CPU, DEVICE_TYPE_CUDA = 0, 1  # a [memory] event's "Device Type" (c10)
STEPS_TID = 1  # host tids: steps lanes first, then one per (stream, lane)


def _us(t: float) -> float:
    return round(t, 3)  # ns resolution: small files, exact values after a JSON round trip


def _check(timeline: Timeline) -> None:
    for s in timeline.spans:
        if not (0 <= s.device < MAX_DEVICES and 0 <= s.stream < OVERFLOW_TID):
            raise ValueError(f"span {s.name!r}: device must be in [0, 64), stream in [0, 1e5)")
        if not s.name or s.dur_us < 0:
            raise ValueError(f"span {s!r}: needs a name and a non-negative duration")
    if any(not 0 <= m.device < MAX_DEVICES for m in timeline.memory):
        raise ValueError("memory events: device must be in [0, 64)")
    for start, end in timeline.steps:
        if not end > start:  # a zero-length step divides by zero in the plugin's Overview
            raise ValueError(f"step ({start}, {end}) must have end > start")


def _shown(args: dict) -> dict:
    """A span's own args as the trace viewer shows them: it leaves a 0 (and an empty
    string) blank, so zeros are written as "0" and empty strings dropped."""
    out = {}
    for k, v in args.items():
        if v == "":
            continue
        numeric = isinstance(v, int | float) and not isinstance(v, bool)
        out[k] = "0" if numeric and v == 0 else v
    return out


def _meta(kind: str, pid: int, tid: int, **args: object) -> dict:
    return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, args: dict) -> dict:
    return dict(ph="X", cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, args=args)


def _steps(timeline: Timeline, spans: list[Span], device: int) -> list[tuple[float, float]]:
    if timeline.steps:  # whole ns: back-to-back steps stay back to back, equal steps equal
        return [(_us(a), _us(a) + _us(b - a)) for a, b in timeline.steps]
    # No steps given: one step over everything, because the plugin needs a host step.
    times = [t for s in spans for t in (s.start_us, s.end_us)]
    times += [m.t_us for m in timeline.memory if m.device == device]
    if not times:
        raise ValueError(f"device {device} has no spans or memory events")
    start, end = _us(min(times)), _us(max(times))
    return [(start, max(end, start + 1.0))]


def _stream_lanes(spans: list[Span], ts: list[float], dur: list[float]) -> list[int]:
    """Overflow lane per span within its stream, computed on the floats the plugin sees;
    `dur` is trimmed in place where back-to-back spans touch only up to float error."""
    by_stream: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(spans):
        by_stream[s.stream].append(i)
    lane_of = [0] * len(spans)
    for idx in by_stream.values():
        lanes, durs = pack([(ts[i], ts[i] + dur[i]) for i in idx])
        for i, lane, d in zip(idx, lanes, durs, strict=True):
            lane_of[i], dur[i] = lane, d
    return lane_of


def _process_meta(timeline: Timeline, device: int) -> list[dict]:
    kind = "CPU" if timeline.on_cpu else "GPU"
    return [
        _meta("process_name", device, 0, name=f"{kind} {device}"),
        _meta("process_labels", device, 0, labels=timeline.device_name or kind),
        _meta("process_sort_index", device, 0, sort_index=device),
        _meta("process_name", HOST_PID, 0, name=f"host ({timeline.label})"),
        _meta("process_sort_index", HOST_PID, 0, sort_index=MAX_DEVICES),
    ]


def _memory_events(
    timeline: Timeline, device: int, ops: dict[str, list], first_tid: int
) -> tuple[list[dict], list[dict]]:
    """The `[memory]` instants, and the 1 ns host ops ("value lanes") that name the
    bytes of a value resident before any op (weights, optimizer state): an event named
    for no span gets an op of its own name, so the Memory view shows the value, not
    `<unknown>`."""
    out, meta = [], []
    value_tids: dict[str, int] = {}
    for m in timeline.memory:
        if m.device != device:
            continue
        t = _us(m.t_us)
        op = next(((a, h) for a, b, h in ops.get(m.name, ()) if a <= t < b), None)
        tid = None if op is None else op[1]
        if op is not None and m.delta_bytes > 0:
            t = op[0]  # what an op makes: at its launch, inside its 1 ns host op
        if tid is None and m.name and m.name not in ops:
            if m.name not in value_tids:
                value_tids[m.name] = tid = first_tid + len(value_tids)
                meta.append(_meta("thread_name", HOST_PID, tid, name=f"value: {m.name}"))
                meta.append(_meta("thread_sort_index", HOST_PID, tid, sort_index=tid))
            tid = value_tids[m.name]
            out.append(_x("cpu_op", m.name, HOST_PID, tid, t, LAUNCH_US, {"value": m.name}))
        tid = STEPS_TID if tid is None else tid
        kind = DEVICE_TYPE_CPU if timeline.on_cpu else DEVICE_TYPE_CUDA
        args = {"Device Type": kind, "Device Id": device, "Addr": m.addr, "Bytes": m.delta_bytes}
        args |= {"Total Allocated": m.total_allocated, "Total Reserved": m.total_reserved}
        head = {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]"}
        out.append(head | {"pid": HOST_PID, "tid": tid, "ts": t, "args": args})
    return out, meta


def build_profiler_trace(timeline: Timeline, device: int) -> dict:
    """The trace of one device as a JSON-ready dict (traceEvents last)."""
    _check(timeline)
    spans = [s for s in timeline.spans if s.device == device]
    meta, events = _process_meta(timeline, device), []

    steps = _steps(timeline, spans, device)
    step_lanes, step_durs = pack(steps)
    for k, ((a, _), lane, d) in enumerate(zip(steps, step_lanes, step_durs, strict=True)):
        name = f"ProfilerStep#{timeline.first_step + k}"
        step = ("user_annotation", name, HOST_PID, STEPS_TID + lane)
        events.append(_x(*step, a, d, {"External id": k + 1}))
    for lane in range(max(step_lanes) + 1):
        name = "steps" + (f" [overlap {lane}]" if lane else "")
        meta.append(_meta("thread_name", HOST_PID, STEPS_TID + lane, name=name))

    ts = [_us(s.start_us) for s in spans]
    dur = [_us(_us(s.end_us) - t) for s, t in zip(spans, ts, strict=True)]
    lane_of = _stream_lanes(spans, ts, dur)
    host_tids: dict[tuple[int, int], int] = {}  # (stream, lane) -> host tid
    first_host_tid = STEPS_TID + max(step_lanes) + 1
    for stream, lane in sorted({(s.stream, lane_of[i]) for i, s in enumerate(spans)}):
        label = timeline.stream_names.get((device, stream), "")
        name = f"stream {stream}" + (f" ({label})" if label else "")
        name += f" [overlap {lane}]" if lane else ""
        dev_tid, host_tid = lane * OVERFLOW_TID + stream, first_host_tid + len(host_tids)
        host_tids[(stream, lane)] = host_tid
        meta.append(_meta("thread_name", device, dev_tid, name=name))
        meta.append(_meta("thread_sort_index", device, dev_tid, sort_index=dev_tid))
        meta.append(_meta("thread_name", HOST_PID, host_tid, name=f"host: {name}"))
        meta.append(_meta("thread_sort_index", HOST_PID, host_tid, sort_index=host_tid))

    ops: dict[str, list[tuple[float, float, int]]] = defaultdict(list)  # name -> host ops
    for i, s in enumerate(spans):
        ext = len(steps) + 1 + i  # External id of the op and correlation id of its launch
        tid, lane = host_tids[(s.stream, lane_of[i])], lane_of[i]
        info = {"stream": s.stream} | ({"phase": s.phase} if s.phase else {})
        op_cat, op_args = "cpu_op", {**info, "External id": ext}
        if s.cat in DEVICE_CATS:
            link = {"External id": ext, "correlation": ext}
            # 1 ns, not 0: a zero-length launch at a step's end is counted in that step.
            launch = min(LAUNCH_US, dur[i])
            events.append(_x("runtime", DEVICE_CATS[s.cat], HOST_PID, tid, ts[i], launch, link))
            dev_args = {**_shown(s.args), **info, "device": device, **link}
            dev_tid = lane * OVERFLOW_TID + s.stream
            events.append(_x(s.cat, s.name, device, dev_tid, ts[i], dur[i], dev_args))
        else:  # host-only work (e.g. cat "cpu_op") keeps its category and args
            op_cat, op_args = s.cat, {**_shown(s.args), **op_args}
        host_dur = launch if s.cat in DEVICE_CATS else dur[i]
        events.append(_x(op_cat, s.name, HOST_PID, tid, ts[i], host_dur, op_args))
        ops[s.name].append((ts[i], ts[i] + dur[i], tid))  # the span's range: its memory
    memory, value_meta = _memory_events(timeline, device, ops, first_host_tid + len(host_tids))
    events += memory
    meta += value_meta
    for m in timeline.marks:  # instants on the stream's device lane; the plugin skips them
        if m.device == device:
            args = {"text": m.text} if m.text else {}
            mark = {"ph": "i", "s": "t", "cat": "user_annotation", "name": m.name}
            events.append(mark | {"pid": device, "tid": m.stream, "ts": _us(m.t_us), "args": args})

    # The plugin indexes deviceProperties by device id, so list every id up to ours; it
    # divides by totalGlobalMem, so leave that out when unknown.
    props = [{"id": i, "name": timeline.device_name or "unknown"} for i in range(device + 1)]
    for p in props if timeline.device_memory_bytes > 0 else ():
        p["totalGlobalMem"] = timeline.device_memory_bytes
    return {
        "schemaVersion": 1,
        "deviceProperties": props,
        "displayTimeUnit": "ms",
        "rollplex": {"label": timeline.label, "device": device},
        # the Trace view's title (the plugin's page passes none: rollplex.trace.offline)
        "traceName": f"{timeline.label} on {timeline.device_name or 'device'} {device}",
        "traceEvents": meta + events,  # last: the Trace view splices GPU counters before `]`
    }


def write_profiler_traces(
    timeline: Timeline, run_dir: str | os.PathLike, *, span: int = 1, worker_prefix: str = "gpu"
) -> list[Path]:
    """Write `<worker_prefix><device>.<span>.pt.trace.json` per device into `run_dir`.

    `span` numbers several traces of one worker in a run (zero-padded: the plugin sorts
    spans as strings). Files appear by rename only after all are written, because the
    plugin loads a run folder once, when it first sees a trace file in it.
    """
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for device in timeline.devices():
            final = run / f"{worker_prefix}{device}.{span:06d}.pt.trace.json"
            tmp = run / f".{final.name}.tmp"  # does not match the plugin's file pattern
            staged.append((tmp, final))
            trace = build_profiler_trace(timeline, device)
            text = json.dumps(trace, separators=(",", ":"), default=str)
            tmp.write_text(text, encoding="utf-8")
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in staged:
        os.replace(tmp, final)
    return [final for _, final in staged]
