"""Quiet by default: a demo run prints its one-time phases, a progress bar that owns its
line and no inner bars or repeated warnings; `--verbose` brings the detail back."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rollplex.jobs.logs import CHATTY, OncePerRun, take_verbose_flag

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
ENV.pop("ROLLPLEX_VERBOSE", None)
DEMO = ("train.steps=3", "train.eval_every=3", "train.eval_prompts=8", "train.checkpoint_every=3")


def _train(run: Path, *extra: str) -> str:
    cmd = [sys.executable, "-m", "rollplex.cli", "train", *extra, *DEMO, f"hydra.run.dir={run}"]
    done = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=ENV
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("logs")
    return {"quiet": _train(root / "quiet"), "verbose": _train(root / "verbose", "--verbose")}


@pytest.mark.slow  # ~15 s a run on the 2-core machine
def test_a_demo_run_is_quiet_and_its_log_lines_own_their_lines(outputs):
    out = outputs["quiet"]
    assert "Loading weights" not in out and "Writing model shards" not in out
    assert "\x1b[A" not in out  # a nested bar's cursor-up
    assert "found the decode finished" not in out  # short answers: not a warning
    assert "train:" in out  # the progress bar shows
    for m in re.finditer(r"\[\d{4}-\d\d-\d\d [\d:,]+\]\[", out):
        assert m.start() == 0 or out[m.start() - 1] in "\r\n", out[m.start() - 80 : m.end()]
    assert "(steps 1-3)" in out and "first 10 steps" not in out


@pytest.mark.slow
def test_verbose_brings_the_detail_back(outputs):
    out = outputs["verbose"]
    assert "Loading weights" in out
    assert re.search(r"\[rollplex\.jobs\.train\]\[DEBUG\] - step 1/\d+: reward", out)
    assert "[DEBUG]" not in outputs["quiet"]


def test_a_warning_is_shown_once_and_its_repeats_counted(caplog):
    log = logging.getLogger(CHATTY[0])
    earlier = list(log.filters)  # an in-process CLI run of another test leaves its own
    for f in earlier:
        log.removeFilter(f)
    once = OncePerRun()
    log.addFilter(once)
    try:
        with caplog.at_level(logging.INFO, logger=CHATTY[0]):
            for _ in range(50):
                log.warning("CPU backend doesn't allow to use `torch.set_num_threads`")
            log.info("an info line")
            log.info("an info line")
    finally:
        log.removeFilter(once)
        for f in earlier:
            log.addFilter(f)
    shown = [r.getMessage() for r in caplog.records]
    assert shown.count("CPU backend doesn't allow to use `torch.set_num_threads`") == 1
    assert shown.count("an info line") == 2  # only warnings are deduplicated
    assert sum(once.repeats.values()) == 49


def test_the_verbose_flag_is_taken_out_of_the_overrides(monkeypatch):
    monkeypatch.delenv("ROLLPLEX_VERBOSE", raising=False)
    assert take_verbose_flag(["train", "seed=1"]) == ["train", "seed=1"]
    assert "ROLLPLEX_VERBOSE" not in os.environ
    assert take_verbose_flag(["train", "--verbose", "seed=1"]) == ["train", "seed=1"]
    assert os.environ["ROLLPLEX_VERBOSE"] == "1"
