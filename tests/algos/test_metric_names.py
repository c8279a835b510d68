"""The loss and KL metrics reach metrics.csv under Rollplex's names and TensorBoard under
verl's too (actor/pg_clipfrac ...), and the older names keep working."""

from __future__ import annotations

import csv

from rollplex.jobs.train_outputs import (
    CSV_FIELDS,
    VERL_NAMES,
    Scalars,
    metrics_row,
    step_line,
    write_csv,
)
from rollplex.runtime.record import StepResult

METRICS = {
    "reward": 0.5, "kl": 0.0, "loss_kl": 0.0, "reward_kl": 0.043, "reward_kl_coef": 0.1,
    "loss": 0.2, "pg_loss": 0.2, "clip_frac": 0.12, "clip_frac_lower": 0.01,
    "entropy": 1.7, "ppo_kl": 0.003, "response_length": 9.0, "train_micro_batches": 2.0,
}  # fmt: skip


def _result() -> StepResult:
    return StepResult(4, 0.0, 1.5, dict(METRICS), [], [], {0: 1024})


class _Writer:
    def __init__(self) -> None:
        self.tags: dict[str, float] = {}

    def add_scalar(self, tag: str, value: float, global_step: int = 0) -> None:
        self.tags[tag] = value


def test_csv_carries_the_kl_split_and_the_clip_fractions(tmp_path):
    row = metrics_row(_result())
    assert row["step"] == 5 and row["step_time_s"] == 1.5 and row["peak_resident_bytes"] == 1024
    for k in ("reward_kl", "loss_kl", "clip_frac", "clip_frac_lower", "kl"):
        assert row[k] == METRICS[k], k
    assert row["train_micro_batches"] == 2.0 and row["eval_accuracy"] == ""
    assert row["cuda_step_peak_bytes"] == ""  # no allocator (CPU)
    write_csv(tmp_path / "m.csv", [row])
    (back,) = list(csv.DictReader((tmp_path / "m.csv").open()))
    assert list(back) == list(CSV_FIELDS) and float(back["reward_kl"]) == 0.043
    assert list(CSV_FIELDS[:3]) == ["step", "reward", "kl"]  # older readers' columns first


def test_a_metric_missing_from_a_step_is_an_empty_cell():
    res = _result()
    del res.metrics["reward_kl"]
    row = metrics_row(res)
    assert row["reward_kl"] == ""


def test_tensorboard_has_verls_keys_beside_ours():
    w = _Writer()
    Scalars(w).on_rl_step_end(_result())
    assert w.tags["train/clip_frac"] == 0.12 and w.tags["actor/pg_clipfrac"] == 0.12
    assert w.tags["actor/pg_clipfrac_lower"] == 0.01
    assert w.tags["actor/entropy"] == 1.7
    assert w.tags["actor/kl_loss"] == 0.0
    assert w.tags["actor/reward_kl_penalty"] == 0.043
    assert w.tags["actor/reward_kl_penalty_coeff"] == 0.1
    # every verl key comes from a metric of ours, and no two of ours share one
    assert len(set(VERL_NAMES.values())) == len(VERL_NAMES)
    assert {v for k, v in VERL_NAMES.items() if k in METRICS} <= set(w.tags)


def test_the_step_line_shows_the_reward_kl_only_where_there_is_one():
    from rollplex.jobs.train_outputs import step_line

    res = _result()
    assert "reward_kl 0.043" in step_line(metrics_row(res))
    del res.metrics["reward_kl"]
    line = step_line(metrics_row(res))
    assert "reward_kl" not in line and "kl 0" in line


def test_a_cuda_step_carries_its_allocator_peak_to_csv_log_and_tensorboard():
    res = _result()
    res.allocator_step_peak, res.allocator_run_peak = 3 * 2**30, 5 * 2**30
    row = metrics_row(res)
    assert row["cuda_step_peak_bytes"] == 3 * 2**30
    assert "allocator peak 3.00 GiB" in step_line(row)
    writer = _Writer()
    Scalars(writer).on_rl_step_end(res)
    assert writer.tags["memory/cuda_step_peak_gib"] == 3.0
