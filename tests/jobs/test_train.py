"""`rollplex train` as a user runs it: a run folder, a kill -9 and a resume that ends on the
same parameters, and clean errors for checkpoints that cannot be resumed."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollplex.runtime.checkpoint import latest_checkpoint
from tests.jobs.cli_run import (
    Result,
    rollplex_here,
    rollplex_in_process,
    shown_lines,
    torch_settings_kept,
)

STEPS = 6
BASE = (
    "model=tiny",
    "workload=tiny",
    "hardware=cpu",
    "algo.lr=1e-3",
    "train.threads=1",
    "train.progress=false",
    f"train.steps={STEPS}",
    # held-out accuracy still runs (step 0 and the last), on 8 prompts, not conf's 512:
    # ~3 s of a run, and no test here reads its figure
    "train.eval_prompts=8",
)
# the repository root on the path: runs start in their own folder and may name a user reward
# by import path (tests/jobs/user_rewards.py)
_PATH = os.pathsep.join(
    filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": _PATH}


def train_cmd(run: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rollplex.cli",
        "train",
        *BASE,
        *overrides,
        f"hydra.run.dir={run}",
    ]


def train(run: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        train_cmd(run, *overrides),
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        cwd=run.parent,
    )


@pytest.fixture
def train_here(monkeypatch, capsys):
    """`train` in this process, for refusals and short runs whose files the test reads (no
    interpreter start-up or imports per case, ~3 s each); the torch settings a run makes
    are undone. The runs whose streams, kill or peak memory matter keep their process."""

    def run(out: Path, *overrides: str) -> Result:
        args = ("train", *BASE, *overrides, f"hydra.run.dir={out}")
        return rollplex_here(out.parent, monkeypatch, capsys, *args)

    with torch_settings_kept():
        yield run


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def final_tensors(run: Path) -> dict[str, torch.Tensor]:
    folder = run / "checkpoints" / f"step-{STEPS:06d}"
    out = load_file(folder / "model" / "model.safetensors")
    opt = torch.load(folder / "optimizer.pt", weights_only=True)["state"]
    out |= {f"adam.{i}.{k}": v for i, st in opt.items() for k, v in st.items()}
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("train") / "full"
    p = train(run, "train.checkpoint_every=3")
    assert p.returncode == 0, p.stderr
    return run


def test_a_run_folder_holds_metrics_traces_checkpoints_and_summary(uninterrupted):
    summary = json.loads((uninterrupted / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["steps_run"] == STEPS
    assert 0 <= summary["final_mean_reward"] <= 1
    ckpts = Path(summary["checkpoint_dir"])
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000003", "step-000006"]
    assert summary["measured_peak_resident_bytes"] <= summary["plan_peak_bytes"]
    tb = {p.name.split(".")[0] for p in (uninterrupted / "tb").iterdir()}
    assert {"planned0", "measured0", "events"} <= tb
    rows = (uninterrupted / "metrics.csv").read_text().splitlines()
    assert len(rows) == STEPS + 1 and rows[0].startswith("step,reward,kl")
    assert json.loads((uninterrupted / "calibration.json").read_text())["entries"]


FORCED = ("train.response_lengths=workload", "train.max_new_tokens=16", "train.steps=2")


@pytest.fixture(scope="module")
def forced_runs(tmp_path_factory) -> dict[str, tuple[Path, Result]]:
    """2 steps with forced response lengths and checkpoint_every=0, under the serial and the
    rollplex (the default) schedule: the forced-length test compares the two, and the
    rollplex run is the checkpoint_every=0 test's run (one run less: ~12 s of CPU). In this
    process: what they check is in their folders and logged lines, not in exit signals."""
    root = tmp_path_factory.mktemp("forced")
    out = {}
    for schedule in ("serial", "rollplex"):
        run = root / schedule
        args = (*BASE, *FORCED, "train.checkpoint_every=0", f"schedule={schedule}")
        p = rollplex_in_process(root, "train", *args, f"hydra.run.dir={run}")
        assert p.returncode == 0, p.stderr[-3000:]
        out[schedule] = (run, p)
    return out


@pytest.mark.slow  # ~30 s: the forced runs it shares
def test_checkpoint_every_0_writes_none_and_the_log_names_every_step(forced_runs):
    run, p = forced_runs["rollplex"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["last_checkpoint"] is None and not (run / "checkpoints").exists()
    line = r"step (\d)/2: reward [\d.e-]+, kl .* s, peak resident"
    logged = re.findall(line, p.stdout + p.stderr)
    assert logged == ["1", "2"], p.stdout[-2000:]


@pytest.mark.slow  # ~30 s: a run killed, then resumed
def test_kill_9_then_resume_ends_on_the_same_parameters(uninterrupted, tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        train_cmd(killed, "train.checkpoint_every=1"),
        env=ENV,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    try:
        while latest_checkpoint(killed / "checkpoints") is None:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    last = latest_checkpoint(killed / "checkpoints")
    assert last is not None and last.name < f"step-{STEPS:06d}"  # killed mid-run
    resumed = tmp_path / "resumed"
    p = train(resumed, f"train.resume={killed}", "train.checkpoint_every=1")
    assert p.returncode == 0, p.stderr
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["resumed_from"] == str(last)
    assert (
        0 < summary["start_step"] < STEPS and summary["steps_run"] == STEPS - summary["start_step"]
    )
    a, b = final_tensors(uninterrupted), final_tensors(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _other_model_checkpoint(folder: Path) -> Path:
    from rollplex.backends.torch.model import build_model
    from rollplex.backends.torch.trainer import TorchTrainer
    from rollplex.runtime.checkpoint import save_checkpoint
    from rollplex.specs import MODEL_PRESETS, AlgoSpec

    other = MODEL_PRESETS["tiny"].model_copy(update={"num_layers": 1, "name": "tiny1"})
    trainer = TorchTrainer(build_model(other, seed=0), other, AlgoSpec())
    return save_checkpoint(folder, 1, trainer, other, seed=0)


def test_what_the_fsdp_trainer_cannot_run_is_refused_before_any_work(train_here, tmp_path):
    pooled = ("schedule=disaggregated", "hardware.num_gpus=2")  # its pools build no critic
    p = train_here(tmp_path / "out", "backend=fsdp", "algo=ppo", "algo.kl_coef=0", *pooled)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "schedule.name=disaggregated with algo=ppo and backend.trainer=fsdp" in p.stderr
    assert not (tmp_path / "out" / "plan.json").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this venv"
)
def test_vllm_rollout_without_vllm_names_what_to_install(tmp_path):
    p = train(tmp_path / "out", "backend.rollout=vllm")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "backend.rollout=vllm" in p.stderr and "pip install vllm" in p.stderr
    assert not (tmp_path / "out" / "plan.json").exists()  # nothing planned, nothing loaded


@pytest.mark.parametrize("knob", ["skinny_gemm", "split_kernel", "split_gemm"])
def test_triton_kernels_off_cuda_are_refused_before_any_work(train_here, tmp_path, knob):
    p = train_here(tmp_path / "out", f"backend.torch_engine.{knob}=true")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"backend.torch_engine.{knob}=true with train.device=cpu" in p.stderr
    assert not (tmp_path / "out" / "plan.json").exists()


def test_the_old_train_backend_key_is_gone(train_here, tmp_path):
    p = train_here(tmp_path / "out", "+train.backend=torch")
    assert p.returncode == 2 and "backend" in p.stderr


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("corrupt", r"model/model\.safetensors: sha256 differs"),
        (
            "other_model",
            r"belongs to another model \('tiny1'\): model\.num_layers: checkpoint has 1",
        ),
        # a GRPO run's checkpoint holds no critic for PPO (tests/jobs/test_ppo_resume.py)
        ("grpo for ppo", r"step-000003/trainer_state\.json: no 'critic_version'"),
    ],
)
def test_a_bad_checkpoint_fails_cleanly_and_stays_untouched(
    uninterrupted, train_here, tmp_path, case, message
):
    if case == "grpo for ppo":
        bad = uninterrupted / "checkpoints" / "step-000003"
    elif case == "corrupt":
        bad = tmp_path / "step-000003"
        shutil.copytree(uninterrupted / "checkpoints" / "step-000003", bad)
        weights = bad / "model" / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    else:
        bad = _other_model_checkpoint(tmp_path / "other")
    before = snapshot(bad)
    out = tmp_path / "out"
    # one case through a real process (its whole stderr is the one line), the rest in this one
    run = train if case == "other_model" else train_here
    p = run(out, f"train.resume={bad}", *(["algo=ppo"] if case == "grpo for ppo" else []))
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(shown_lines(p.stderr)) == 1, p.stderr
    assert re.search(message, p.stderr), p.stderr
    assert snapshot(bad) == before
    assert not (out / "checkpoints").exists()  # it stopped before training


@pytest.mark.slow  # ~5-15 s a run
@pytest.mark.parametrize("algo", ["rloo", "ppo"])
def test_rloo_and_ppo_train(train_here, tmp_path, algo):
    # in this process (train_here): no interpreter start-up, ~4 s a run
    # PPO with an entropy term (the entropy carries grad), RLOO with the metric only
    coeff = "0.01" if algo == "ppo" else "0"
    # RLOO trains every row: the demo reward leaves whole steps of groups all 0, whose
    # skipped rows (algo.skip_zero_advantage) would have no entropy to log
    every = () if algo == "ppo" else ("algo.skip_zero_advantage=false",)
    p = train_here(
        tmp_path / algo, f"algo={algo}", "train.steps=3", f"algo.entropy_coeff={coeff}", *every
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / algo / "summary.json").read_text())
    assert summary["steps_run"] == 3
    rows = list(csv.DictReader((tmp_path / algo / "metrics.csv").open()))
    assert len(rows) == 3 and all(float(r["entropy"]) > 0 for r in rows)  # logged each step
    if algo == "ppo":  # its checkpoint holds the critic: the run resumes, one step more
        again = tmp_path / "again"
        q = train_here(again, "algo=ppo", "train.steps=4", f"train.resume={tmp_path / algo}")
        assert q.returncode == 0, q.stderr
        summary = json.loads((again / "summary.json").read_text())
        assert (summary["start_step"], summary["steps_run"]) == (3, 1)
        state = json.loads((again / "checkpoints/step-000004/trainer_state.json").read_text())
        assert state["critic_version"] == state["version"] == 4


def test_kl_in_reward_with_a_vllm_rollout_is_refused_before_any_work(train_here, tmp_path):
    # (kl_in_reward without a reference is refused by the spec itself, naming the field)
    kl = ("algo.kl_in_reward=true", "algo.use_reference=true", "algo.kl_coef=0.01")
    p = train_here(tmp_path / "out", "algo=ppo", *kl, "backend.rollout=vllm")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "kl_in_reward with backend.rollout=vllm" in p.stderr
    assert not (tmp_path / "out" / "plan.json").exists()


def test_forced_response_lengths_are_the_workloads_and_shared_by_schedules(forced_runs):
    """train.response_lengths=workload: each response runs to a length drawn from
    workload.response_length (eos ignored), the same draws under every schedule."""
    from rollplex.runtime.rollout_ops import forced_lengths
    from rollplex.specs import WORKLOAD_PRESETS

    means, clipped = {}, {}
    for schedule, (run, _) in forced_runs.items():
        with (run / "metrics.csv").open() as f:
            rows = list(csv.DictReader(f))
        means[schedule] = [float(r["response_length"]) for r in rows]
        clipped[schedule] = [float(r["response_clip_ratio"]) for r in rows]
    w = WORKLOAD_PRESETS["tiny"]
    rows = w.prompts_per_step * 16  # conf/train.yaml's group size
    drawn = [forced_lengths(w.response_length, rows, 16, 0, s) for s in (0, 1)]
    want = [sum(d) / rows for d in drawn]
    assert means["serial"] == means["rollplex"]
    assert means["serial"] == pytest.approx(want, abs=1e-4)
    assert len(set(want)) == 2 and all(1 < m < 16 for m in want)
    # verl's response_length/clip_ratio: the share that ran to the cap of 16 (these draws
    # stay under it: tests/runtime/test_rollout_metrics.py has responses that reach it)
    at_cap = [sum(n == 16 for n in d) / rows for d in drawn]
    assert clipped["serial"] == clipped["rollplex"] == pytest.approx(at_cap, abs=1e-6)


def test_forced_lengths_with_a_tp_rollout_are_refused_before_any_work(train_here, tmp_path):
    p = train_here(
        tmp_path / "out", "backend=fsdp", "backend.fsdp.rollout_tp=2",
        "backend.fsdp.rollout_sync=share", "train.response_lengths=workload",
    )  # fmt: skip
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "train.response_lengths=workload" in p.stderr
    assert not (tmp_path / "out" / "plan.json").exists()
