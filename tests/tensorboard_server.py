"""A real TensorBoard on loopback for tests: started, polled within a deadline, killed."""

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
from contextlib import contextmanager
from pathlib import Path

API = "/data/plugin/pytorch_profiler/"
DEADLINE_S = 150.0  # a loaded 2-core CI box starts TensorBoard and parses traces slowly
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
        """Poll `probe` until it returns something truthy, within the deadline."""
        while time.monotonic() < self.deadline:
            try:
                if result := probe():
                    return result
            except OSError:  # not listening yet, or 404 while the run loads
                pass
            time.sleep(0.5)
        raise TimeoutError(f"TensorBoard: {what} not ready within {DEADLINE_S:.0f} s")


@contextmanager
def tensorboard(logdir: Path, run: str, log: Path) -> Iterator[Server]:
    """Serve `logdir` until the block ends; yields once `run` is listed by the plugin."""
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
        srv.wait_for("run list", lambda: run in srv.get(API + "runs")["runs"])
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
