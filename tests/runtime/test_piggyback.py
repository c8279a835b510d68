"""The executor applies the plan's piggybacking: every chunk the plan puts on the decode
stream as `piggyback` rides a decode step of the live session (one set of GEMMs), the run
trains what the serial run trains, and where the roles cannot ride the step runs
separately and says so (run log, the step's deviations); rows that would read other
weights than the decode are refused."""

from __future__ import annotations

import logging

import pytest
import torch

import rollplex.engine.workspace as workspace
from rollplex.backends.base import BackendError
from rollplex.backends.torch.roles import TorchDecode
from rollplex.planner.plan import CoRun
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import cached_run, run_schedule

PIGGYBACK = ScheduleSpec(name="rollplex", overlap="piggyback", chunk_tokens=40)


def _riders(run) -> list:
    return [s for s in run.planned.plan.devices[0].steps if s.corun is CoRun.PIGGYBACK]


def test_every_planned_rider_rides_a_decode_step(monkeypatch):
    rides = []
    real = workspace.ride_step

    def spy(*args, **kwargs):
        rides.append(args[-1].embeds.shape[0])  # the chunk's prompts
        return real(*args, **kwargs)

    monkeypatch.setattr(workspace, "ride_step", spy)
    max_new = 12  # enough decode steps left for every chunk of the window
    run = run_schedule(PIGGYBACK, steps=2, max_new_tokens=max_new)
    riders = _riders(run)
    assert len(riders) >= 2 and all(s.kind == "logprob_prefix" for s in riders)
    assert len(rides) == 2 * len(riders)  # each planned chunk, each RL step
    assert sum(rides) == 2 * run.planned.graph.values["prompts.text"].shape[0]
    for r in run.results:
        assert not any(m.deviations for m in r.steps), [m.deviations for m in r.steps]
    serial = run_schedule(ScheduleSpec(name="serial"), steps=2, max_new_tokens=max_new)
    a, b = serial.params(), run.params()
    for n in a:  # same math; the concatenated GEMMs may round differently
        torch.testing.assert_close(b[n], a[n], atol=1e-6, rtol=0, msg=n)
    assert [r.metrics["reward"] for r in serial.results] == [
        r.metrics["reward"] for r in run.results
    ]


def test_a_decode_that_cannot_host_rows_runs_them_separately_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(TorchDecode, "ride", lambda self, rows: None)
    with caplog.at_level(logging.WARNING, logger="rollplex.runtime.executor"):
        run = run_schedule(PIGGYBACK, steps=2)
    names = {s.name for s in _riders(run)}
    for r in run.results:
        for m in r.steps:
            if m.step.name in names:
                assert any("cannot host rows" in d for d in m.deviations), m.deviations
    # logged once per position, not once per RL step
    assert caplog.text.count("cannot host rows") == len(names)
    a, b = run_schedule(ScheduleSpec(name="serial"), steps=2).params(), run.params()
    assert all(torch.equal(a[n], b[n]) for n in a)  # run separately: serial's math exactly


def test_a_ride_after_the_decode_finished_is_reported():
    run = run_schedule(PIGGYBACK, steps=1, max_new_tokens=3)  # the decode ends early
    last = [m for m in run.results[0].steps if m.step.corun is CoRun.PIGGYBACK][-1]
    assert any("found the decode finished" in d for d in last.deviations)


def test_rows_of_other_weights_are_refused_by_name():
    run = cached_run(PIGGYBACK)
    ops = run.backend.rollout_ops
    op = run.planned.graph.ops[_riders(run)[0].op]

    class Stale:
        name = "policy@99"

    ops.live = object()  # a decode in flight
    with pytest.raises(BackendError, match=f"'{op.name}' would ride the decode with policy@99"):
        ops.ride(op, {"weights": Stale(), "features": None, "text": None}, True)
    ops.live = None
