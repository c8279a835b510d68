"""The planned-vs-measured panel: both Gantt charts on one axis, the per-op ratio table
marked calibrated or not, written into the Images tab of the run; planned and measured
workers number their ProfilerSteps alike."""

from __future__ import annotations

import dataclasses
import io

import pytest
from PIL import Image

from rollplex.runtime import measured_timeline
from rollplex.runtime.profile import comparison_image, export_run, load_trace
from rollplex.specs import ScheduleSpec
from rollplex.trace import open_writer, write_image
from rollplex.trace.from_plan import plan_timeline
from rollplex.trace.gantt import comparison_png, op_ratios
from tests.runtime.conftest import cached_run


@pytest.fixture(scope="module")
def run():
    return cached_run(ScheduleSpec(name="rollplex", overlap="piggyback"))


def _pixels(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png)).convert("RGB")


def test_the_table_pairs_every_op_and_sums_its_steps(run):
    plan, results = run.planned.plan, run.results
    planned = plan_timeline(plan, steps=len(results))
    measured = measured_timeline(plan, results)
    rows = op_ratios(planned, measured)
    names = {s.name for s in plan.all_steps()}
    assert {r.name for r in rows} == names
    for r in rows:
        runs = [m for res in results for m in res.steps if m.step.name == r.name]
        assert r.measured_us == pytest.approx(sum(m.seconds for m in runs) * 1e6, rel=1e-6)
        assert r.ratio == pytest.approx(r.measured_us / r.planned_us)
    assert [r.measured_us for r in rows] == sorted((r.measured_us for r in rows), reverse=True)


@pytest.mark.parametrize("calibrated", [None, "calibration.json"])
def test_the_panel_draws_both_charts_and_says_whether_calibrated(run, calibrated):
    png = comparison_image(run.planned.plan, run.results, calibrated=calibrated, device_name="cpu")
    image = _pixels(png)
    lanes = {(i, s.stream) for i, d in enumerate(run.planned.plan.devices) for s in d.steps}
    assert image.width == 1400 and image.height > 2 * len(lanes) * 18
    colours = set(image.getdata())
    assert (76, 114, 176) in colours and (85, 168, 104) in colours  # rollout and train bars
    # the header's dark red text marks an uncalibrated plan only (bars are never so dark)
    red = any(r > 100 and g < 40 and b < 40 for r, g, b in colours)
    assert red == (calibrated is None)


def test_an_empty_measured_side_still_draws(run):
    planned = plan_timeline(run.planned.plan)
    empty = dataclasses.replace(planned, spans=[], memory=[], steps=[], label="nothing ran")
    assert _pixels(comparison_png(planned, empty, calibrated=None)).width == 1400


def test_the_panel_lands_in_the_images_tab(run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    png = comparison_image(run.planned.plan, run.results, calibrated=None, device_name="cpu")
    with open_writer(tmp_path) as w:
        write_image(w, "timeline/planned_vs_measured", png)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    (image,) = events.Images("timeline/planned_vs_measured")
    assert image.encoded_image_string == png
    assert (image.width, image.height) == _pixels(png).size


def test_planned_and_measured_workers_name_their_steps_alike(run, tmp_path):
    later = run.results[1:]  # RL steps 1 and 2: not numbered from 0
    paths = export_run(tmp_path, run.planned.plan, later, device_name="cpu")
    steps = {}
    for p in paths:
        if ".pt.trace.json" in p.name:
            trace = load_trace(p)
            steps[p.name.split(".")[0]] = [
                e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")
            ]
    assert steps["planned0"] == steps["measured0"] == ["ProfilerStep#1", "ProfilerStep#2"]
