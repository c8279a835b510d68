"""A real TensorBoard on loopback serves our run through the torch-tb-profiler HTTP API."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
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

pytest.importorskip("tensorboard", reason="tensorboard is not installed")
pytest.importorskip(
    "torch_tb_profiler", reason="torch-tb-profiler (the TensorBoard plugin) is not installed"
)

RUN = "planned"
API = "/data/plugin/pytorch_profiler/"
DEADLINE_S = 60.0
# Loopback only: never let an http_proxy from the environment see these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Server:
    def __init__(self, deadline: float) -> None:
        self.url = ""
        self.deadline = deadline

    def get(self, path: str, **params: object) -> object:
        query = urllib.parse.urlencode(params)
        with _OPENER.open(f"{self.url}{path}?{query}", timeout=20) as resp:
            body = resp.read()
            if resp.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
        return json.loads(body)

    def wait_for(self, what: str, probe: Callable[[], object]) -> object:
        """Poll `probe` until it returns something truthy, within the test's deadline."""
        while time.monotonic() < self.deadline:
            try:
                if result := probe():
                    return result
            except OSError:  # not listening yet, or 404 while the run loads
                pass
            time.sleep(0.5)
        raise TimeoutError(f"TensorBoard: {what} not ready within {DEADLINE_S:.0f} s")


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
    # --port 0: the OS picks a free port, read back from the start-up line. --load_fast=false
    # keeps to the Python data path that plugins use (no Rust data server subprocess).
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--load_fast=false"]
    cmd += ["--host", "127.0.0.1", "--port", "0"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        srv = Server(deadline=time.monotonic() + DEADLINE_S)

        def started() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"tensorboard exited:\n{log.read_text()[-3000:]}")
            m = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text(errors="replace"))
            return m and f"http://127.0.0.1:{m.group(1)}"

        srv.url = srv.wait_for("start-up", started)
        srv.wait_for("run list", lambda: RUN in srv.get(API + "runs")["runs"])
        yield srv
    finally:
        # Our own process group (start_new_session): TensorBoard and the plugin's loaders.
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait_s)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


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
