"""Two tiny CPU train runs, as bench/gpu_first_run.sh runs the GPU ones: the first run's
calibration.json records where it was measured, `calibration=auto` prices the second with
it, both say what priced the plan and list their one-time phases, and
bench/gpu_first_run.py assembles first_run.json's rows from the two folders."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest
from PIL import Image

from rollplex.jobs.pricing import UNCALIBRATED
from rollplex.ops.calibration import load_calibration
from tests.jobs.cli_run import rollplex_in_process

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # two tiny CPU runs of 2 steps, in this process: ~10 s


def bench_module():
    spec = importlib.util.spec_from_file_location("gpu_first_run", ROOT / "bench/gpu_first_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(run: Path, *extra: str) -> dict:
    """A run in this process: what the tests read is in its folder (summary, cli.log)."""
    args = ["train", "train.steps=2", "train.progress=false", "train.checkpoint_every=0",
            "train.eval_every=0", "train.threads=1", *extra, f"hydra.run.dir={run}"]  # fmt: skip
    p = rollplex_in_process(run.parent, *args)
    assert p.returncode == 0, p.stderr
    summary = json.loads((run / "summary.json").read_text())
    return summary | {"run": run, "log": (run / "cli.log").read_text()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict]:
    root = tmp_path_factory.mktemp("first_run") / "outputs" / "train"
    root.mkdir(parents=True)
    first = train(root / "tiny_grpo_run1")
    return first, train(root / "tiny_grpo_run2", "calibration=auto")


def test_a_run_records_provenance_and_the_next_one_is_priced_by_it(runs):
    first, second = runs
    assert first["priced_by"] == UNCALIBRATED  # hardware=cpu ships no constants
    assert "plan priced by: uncalibrated" in first["log"]
    file = first["run"] / "calibration.json"
    cal = json.loads(file.read_text())
    assert (cal["device"], cal["hardware"], cal["model"]) == ("cpu", "cpu", "tiny")
    assert cal["model_shape"]["hidden_size"] > 0 and cal["software"]["torch"]
    # what priced its predictions: the bare model (cpu), so a calibration rescales that
    assert cal["priced_with"] == {"scales": {}, "fixed_s": {}, "dispatch_s": 0.0}
    load_calibration(file)  # valid, every kind known
    assert second["priced_by"] == str(file)
    assert f"plan priced by: {file}" in second["log"]
    # the planned-vs-measured panel's header says the same: dark red for an uncalibrated
    # plan only (it printed the calibration spec's repr as "calibrated with ...")
    for run, uncalibrated in ((first, True), (second, False)):
        panel = Image.open(run["run"] / "tb" / "planned_vs_measured.png").convert("RGB")
        red = any(r > 100 and g < 40 and b < 40 for r, g, b in set(panel.getdata()))
        assert red == uncalibrated


def test_each_run_logs_its_phases_and_its_prediction(runs):
    for summary in runs:
        names = [p["name"] for p in summary["phases"]]
        assert names == ["model load", "first step (warm-up)"]  # CPU: nothing compiles
        assert all(f"{n}: " in summary["log"] for n in names)
        ratio = summary["median_step_time_s"] / summary["plan_step_time_s"]
        assert summary["measured_over_predicted"] == pytest.approx(ratio)
        assert f"measured/predicted {ratio:.2f}" in summary["log"]


def step_times(run: Path) -> list[float]:
    rows = (run / "metrics.csv").read_text().splitlines()
    col = rows[0].split(",").index("step_time_s")
    return [float(r.split(",")[col]) for r in rows[1:]]


def test_the_bench_assembles_first_run_rows_from_the_folders(runs, tmp_path):
    bench = bench_module()
    first, second = runs
    (row,) = bench.collect(first["run"].parent)
    t1, t2 = step_times(first["run"]), step_times(second["run"])
    assert (row["shape"], row["algo"], row["device_name"]) == ("tiny", "grpo", "cpu")
    assert row["predicted_step_s"] == first["plan_step_time_s"]
    assert row["measured_step_s"] == statistics.median(t1[1:] + t2[1:])
    assert (row["first_step_s"], row["first_step_second_run_s"]) == (t1[0], t2[0])
    assert row["priced_by"] == UNCALIBRATED
    assert row["prediction_within_20pct"] == (abs(row["measured_over_predicted"] - 1) <= 0.2)
    assert [p["name"] for p in row["phases_s"]["run2"]] == ["model load", "first step (warm-up)"]
    # an earlier file's rows for other shapes are kept, this shape's replaced
    earlier = tmp_path / "earlier.json"
    old = {"shape": "tiny", "algo": "grpo", "measured_step_s": -1.0}
    other = {"shape": "qwen2_5_vl_7b", "algo": "ppo", "measured_step_s": 4.5}
    earlier.write_text(json.dumps({"rows": [old, other]}))
    out = tmp_path / "first_run.json"
    bench.main(["--runs", str(first["run"].parent), "--out", str(out), "--merge", str(earlier)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["shape"], r["algo"]) for r in rows] == [("qwen2_5_vl_7b", "ppo"), ("tiny", "grpo")]
    assert rows[0] == other and rows[1]["measured_step_s"] == row["measured_step_s"]
    for key in ("shape", "algo", "device_name", "predicted_step_s", "measured_step_s",
                "first_step_s", "first_step_second_run_s"):  # fmt: skip
        assert key in rows[1]


def test_a_first_run_without_its_second_gives_a_row_without_it(runs, tmp_path):
    bench = bench_module()
    only = tmp_path / "tiny_ppo_run1"
    only.symlink_to(runs[0]["run"], target_is_directory=True)
    (row,) = bench.collect(tmp_path)
    assert row["algo"] == "ppo" and row["first_step_second_run_s"] is None
    assert row["measured_step_s"] == statistics.median(step_times(runs[0]["run"])[1:])
