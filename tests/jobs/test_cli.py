"""The console entry point, as a user runs it: jobs, run folders, errors, sweeps (the sweeps
and the torch-free start-up in real processes, the rest through `rollplex.cli.main` here)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollplex.planner.validate import load_plan
from tests.jobs.cli_run import rollplex, rollplex_here, run_dir


def test_graph_job_shows_the_prefix_saving(tmp_path: Path, monkeypatch, capsys) -> None:
    p = rollplex_here(
        tmp_path,
        monkeypatch,
        capsys,
        "graph",
        "model=qwen2_5_vl_7b",
        "algo=grpo",
        "workload.group_size=8",
    )
    assert p.returncode == 0, p.stderr
    out = run_dir(tmp_path, "graph")
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "total_flops_before_passes",
        "total_flops_after_passes",
        "prefix_flops_before_passes",
        "prefix_flops_after_passes",
        "params_total",
    ):
        assert summary[key] > 0
    # share_group_prefix alone divides the reference+train prefix work by G = 8.
    ratio = summary["prefix_flops_before_passes"] / summary["prefix_flops_after_share_group_prefix"]
    assert ratio == pytest.approx(8.0, rel=0.05)
    assert summary["params_total"] == 8_292_166_656
    assert json.loads((out / "config.json").read_text())["workload"]["group_size"] == 8
    assert "share_group_prefix" in p.stdout


@pytest.mark.parametrize(
    "override, field",
    [
        ("workload.group_size=0", "workload.group_size"),
        ("schedule.chunk_tokens=-1", "schedule.chunk_tokens"),
    ],
)
def test_bad_field_is_named_without_traceback(
    tmp_path: Path, monkeypatch, capsys, override: str, field: str
) -> None:
    p = rollplex_here(tmp_path, monkeypatch, capsys, "graph", override)
    assert p.returncode == 2
    assert field in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "outputs" / "graph").exists() or not any(
        (d / "summary.json").exists() for d in (tmp_path / "outputs" / "graph").iterdir()
    )


def test_unknown_model_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    p = rollplex_here(tmp_path, monkeypatch, capsys, "graph", "model=qwen9_vl")
    assert p.returncode == 2
    assert "qwen9_vl" in p.stderr and "Traceback" not in p.stderr


def test_plan_job_writes_its_run_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    p = rollplex_here(
        tmp_path, monkeypatch, capsys, "plan", "hardware=h200x2", "workload.prompts_per_step=8"
    )
    assert p.returncode == 0, p.stderr
    out = run_dir(tmp_path, "plan")
    s = json.loads((out / "summary.json").read_text())
    for key in (
        "schedule",
        "step_time_s",
        "peak_bytes_per_gpu",
        "lower_bound_bytes",
        "fits_budget",
        "speedup_vs_serial",
        "speedup_vs_serial_dedup",
    ):
        assert key in s
    assert s["speedup_vs_serial_dedup"] >= 1.0 and s["fits_budget"]
    plan = json.loads((out / "plan.json").read_text())
    loaded = load_plan((out / "plan.json").read_text())
    assert loaded.schedule == "rollplex" and loaded.step_time_s > 0
    assert plan["schedule"] == "rollplex" and plan["devices"][0]["steps"]
    assert list((out / "tb").glob("planned0.*.pt.trace.json"))
    assert "speedup vs serial" in (out / "plan.md").read_text()


def test_multirun_sweep_makes_one_table(tmp_path: Path) -> None:
    # 3B: a one-GPU training pool must still hold its optimizer state.
    p = rollplex(
        tmp_path,
        "plan",
        "-m",
        "schedule=serial,disaggregated,rollplex",
        "model=qwen2_5_vl_3b",
        "hardware=h200x2",
        "workload.prompts_per_step=8",
    )
    assert p.returncode == 0, p.stderr
    (sweep,) = (tmp_path / "multirun" / "plan").iterdir()
    rows = list(csv.DictReader((sweep / "comparison.csv").open()))
    assert sorted(r["schedule"] for r in rows) == ["disaggregated", "rollplex", "serial"]
    assert len(list(sweep.glob("*/tb/planned0.*.pt.trace.json"))) == 3
    assert "| run |" in (sweep / "comparison.md").read_text()


def test_calibration_rescales_plan_and_baselines_alike(tmp_path: Path, monkeypatch, capsys) -> None:
    cal = Path(__file__).resolve().parents[2] / "bench/results/calibration_h200_qwen2_5_vl_7b.json"
    base = rollplex_here(
        tmp_path / "a",
        monkeypatch,
        capsys,
        "plan",
        "hardware=h200x2",
        "workload.prompts_per_step=8",
    )
    tuned = rollplex_here(
        tmp_path / "b",
        monkeypatch,
        capsys,
        "plan",
        "hardware=h200x2",
        "workload.prompts_per_step=8",
        f"calibration={cal}",
    )
    assert base.returncode == 0 and tuned.returncode == 0, tuned.stderr
    a = json.loads((run_dir(tmp_path / "a", "plan") / "summary.json").read_text())
    b = json.loads((run_dir(tmp_path / "b", "plan") / "summary.json").read_text())
    assert b["calibration"] == str(cal)
    # Measured ops were slower than the roofline, and the baselines used the same model.
    assert b["step_time_s"] > a["step_time_s"]
    assert b["speedup_vs_serial_dedup"] >= 1.0
    missing = rollplex_here(tmp_path / "c", monkeypatch, capsys, "plan", "calibration=nope.json")
    assert missing.returncode == 2 and "nope.json" in missing.stderr


def test_planning_imports_no_torch(tmp_path: Path) -> None:
    """`rollplex plan` and `graph` stay free of torch (2-4 s of start-up they do not need)."""
    code = (
        "import sys\n"
        "from rollplex.cli import main\n"
        "main(['graph', 'model=qwen2_5_vl_3b'])\n"
        # 8 prompts: the video preset's 128 need ~257 GiB of saved activations on one GPU
        "main(['plan', 'model=qwen2_5_vl_3b', 'hardware=h200', 'workload.prompts_per_step=8'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"
    assert (run_dir(tmp_path, "plan") / "tb").is_dir()


@pytest.mark.parametrize(
    "content, words",
    [
        ("[1, 2]", "top level: Input should be"),
        ('{"format": "rollplex-calibration/1", "device": "x", "entries": "abc"}', "entries:"),
        ("{not json", "not valid JSON"),
        (
            '{"format": "rollplex-calibration/1", "device": "x", "entries": '
            '[{"kind": "decode", "predicted_s": 0.01, "measured_s": 1e-9}]}',
            "entries[0].measured_s: Input should be greater than or equal to 0.000001",
        ),
        (
            '{"format": "rollplex-calibration/1", "device": "x", "entries": '
            '[{"kind": "decode", "predicted_s": "fast", "measured_s": 0.1}]}',
            "entries[0].predicted_s",
        ),
        (  # a top-level check names the kind, without echoing the whole file
            '{"format": "rollplex-calibration/1", "device": "x", "entries": '
            '[{"kind": "decode", "predicted_s": 100.0, "measured_s": 0.001}]}',
            "kind 'decode': predicted/measured is 1e+05, outside [0.0001, 10000]",
        ),
    ],
)
def test_bad_calibration_file_is_one_line(
    tmp_path: Path, monkeypatch, capsys, content: str, words: str
) -> None:
    cal = tmp_path / "cal.json"
    cal.write_text(content)
    p = rollplex_here(
        tmp_path / "run", monkeypatch, capsys, "plan", "model=qwen2_5_vl_3b", f"calibration={cal}"
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert f"calibration file '{cal}'" in line and words in line, line
    assert "(got {" not in line, line


def test_a_failing_run_does_not_end_the_sweep(tmp_path: Path) -> None:
    # Disaggregated needs two GPUs: on one H200 that run fails, the other two plan.
    p = rollplex(
        tmp_path,
        "plan",
        "-m",
        "schedule=serial,disaggregated,rollplex",
        "hardware=h200",
        "model=qwen2_5_vl_3b",
        "workload.prompts_per_step=8",
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "1 run(s) of the sweep failed" in p.stderr
    (sweep,) = (tmp_path / "multirun" / "plan").iterdir()
    rows = {r["schedule"]: r for r in csv.DictReader((sweep / "comparison.csv").open())}
    assert sorted(rows) == ["disaggregated", "rollplex", "serial"]
    assert rows["disaggregated"]["status"] == "failed"
    assert "GPU" in rows["disaggregated"]["error"]
    assert rows["serial"]["status"] == rows["rollplex"]["status"] == "ok"
    assert float(rows["rollplex"]["step_time_s"]) > 0
    table = (sweep / "comparison.md").read_text()
    assert "failed" in table and rows["disaggregated"]["error"][:30] in table


def test_summary_names_the_overridden_hardware_and_one_naive_colocation(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from rollplex.jobs.pipeline import plan_step
    from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
    from rollplex.specs.roles import TORCH_ROLLOUT
    from rollplex.specs.schedule import ScheduleSpec

    p = rollplex_here(
        tmp_path,
        monkeypatch,
        capsys,
        "plan",
        "model=qwen2_5_vl_3b",
        "hardware=h200x8",
        "hardware.num_gpus=16",
    )
    assert p.returncode == 0, p.stderr
    s = json.loads((run_dir(tmp_path, "plan") / "summary.json").read_text())
    assert s["hardware"] == "h200x8 (num_gpus=16)" and s["gpus"] == 16
    # One meaning: verl's serial step under the naive strategy (every tensor, whole step).
    hw = HARDWARE_PRESETS["h200x8"].model_copy(update={"num_gpus": 16})
    naive = plan_step(
        MODEL_PRESETS["qwen2_5_vl_3b"],
        WORKLOAD_PRESETS["video"],
        AlgoSpec(),
        hw,
        ScheduleSpec(name="serial", dedup=False, memory_strategy="naive"),
        enforce_budget=False,
        rollout=TORCH_ROLLOUT,  # the job's default backend (its static decode workspace)
    )
    assert s["naive_colocation_bytes"] == naive.plan.peak_bytes_per_gpu
    assert s["naive_colocation_bytes"] > s["peak_bytes_per_gpu"]


def test_bad_train_tp_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    p = rollplex_here(
        tmp_path, monkeypatch, capsys, "plan", "hardware=h200x8", "schedule.parallel.train_tp=16"
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "schedule.parallel.train_tp=16" in line and "8 GPUs" in line, line
