"""A real TensorBoard on loopback serves our run through the torch-tb-profiler HTTP API."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollplex.trace import (
    Timeline,
    open_writer,
    write_hparams,
    write_profiler_traces,
    write_scalars,
    write_table,
)
from tests.tensorboard_server import API, Server, tensorboard

pytest.importorskip("tensorboard", reason="tensorboard is not installed")
pytest.importorskip(
    "torch_tb_profiler", reason="torch-tb-profiler (the TensorBoard plugin) is not installed"
)

RUN = "planned"


@pytest.fixture(scope="module")
def run_timeline(timeline_factory: Callable[..., Timeline]) -> Timeline:
    return timeline_factory(RUN)


def _write_run(logdir: Path, timeline: Timeline) -> None:
    run = logdir / RUN
    write_profiler_traces(timeline, run)
    with open_writer(run) as w:
        write_scalars(w, {"step_time_s": 0.01, "peak_bytes": 11 << 30})
        write_table(w, "plan", ["op", "us"], [["decode", 4800.0]])
        write_hparams(w, {"schedule": "rollplex"}, {"speedup_vs_serial": 1.07})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, run_timeline: Timeline) -> Iterator[Server]:
    logdir = tmp_path_factory.mktemp("tb")
    _write_run(logdir, run_timeline)
    log = tmp_path_factory.mktemp("tb_log") / "tensorboard.log"
    with tensorboard(logdir, RUN, log) as srv:
        yield srv


def test_views_workers_and_spans(server: Server) -> None:
    views = server.get(API + "views", run=RUN)
    assert {"Overview", "Operator", "Kernel", "Trace", "Memory"} <= set(views)
    assert server.get(API + "workers", run=RUN, view="Trace") == ["gpu0", "gpu1"]
    for worker in ("gpu0", "gpu1"):
        assert server.get(API + "spans", run=RUN, worker=worker) == ["1"]


def test_trace_is_valid_json_with_our_events_and_gpu_counters(
    server: Server, run_timeline: Timeline
) -> None:
    timeline = run_timeline
    for device in (0, 1):
        trace = server.get(API + "trace", run=RUN, worker=f"gpu{device}", span=1)
        events = trace["traceEvents"]
        kernels = sorted(e["name"] for e in events if e.get("cat") == "kernel")
        want = sorted(s.name for s in timeline.spans if s.device == device and s.cat == "kernel")
        assert kernels == want
        names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        assert "stream 7 (decode)" in names
        # The plugin spliced its utilization counters into our array: still valid JSON.
        assert any(e.get("name") == f"GPU {device} Utilization" for e in events)


def test_memory_curve_and_overview(server: Server, run_timeline: Timeline) -> None:
    timeline = run_timeline
    for device in (0, 1):
        q = {"run": RUN, "worker": f"gpu{device}", "span": 1}
        curve = server.get(API + "memory_curve", memory_metric="B", **q)
        rows = curve["rows"][f"GPU{device}"]
        peak = max(m.total_allocated for m in timeline.memory if m.device == device)
        assert max(r[1] for r in rows) == peak
        overview = server.get(API + "overview", **q)
        assert len(overview["steps"]["rows"]) == len(timeline.steps)


def test_scalars_text_and_hparams_share_the_run(server: Server) -> None:
    def tags() -> dict | None:
        return server.get("/data/plugin/scalars/tags").get(RUN)

    scalar_tags = server.wait_for("scalars", tags)
    assert {"step_time_s", "peak_bytes", "speedup_vs_serial"} <= set(scalar_tags)
    assert RUN in server.get("/data/plugin/text/tags")
