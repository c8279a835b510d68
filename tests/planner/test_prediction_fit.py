"""bench/prediction_fit.py and prediction_runs.py: what fits the shipped H200 constants and
re-prices the recorded runs. The fit recovers known constants from observations made by
them (on a grid of kinds and workloads, outliers left out, workloads weighed alike); a
step's drawn lengths are the runtime's (`forced_lengths`), and a plan priced at them sees
their longest row; the held-out fit of a run never reads that run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rollplex.planner.cost_model import CostModel
from rollplex.runtime.rollout_ops import forced_lengths
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.run import RunSpec
from rollplex.specs.workload import ResponseLengthSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import prediction_fit as pf
import prediction_runs as pr

TRUE = {"vision_encode": (0.7, 0.0), "backward": (0.9, 0.2), "logprob_response": (0.85, 0.06)}
DECODE_FIXED, DISPATCH = 4.6e-5, 0.016


def _observations(runs=(10, 11, 12), outlier: bool = False):
    obs, gaps = [], []
    for run in runs:
        workload = f"w{run}"
        for step, raw in enumerate((0.1 * run, 0.05 * run + 0.3, 0.02 * run**2), start=2):
            for kind, (k, c) in TRUE.items():
                runs_ = 3 + run % 2 if c else 1
                seconds = raw / k + c * runs_
                obs.append(pf.Observation(run, workload, f"r{run}", step, kind, kind, raw,
                                          runs_, seconds))  # fmt: skip
            layer_steps = 28 * (100 + 50 * step + run)
            obs.append(pf.Observation(run, workload, f"r{run}", step, "decode", "decode", raw,
                                      layer_steps, raw + DECODE_FIXED * layer_steps))  # fmt: skip
            issued = 12 + run % 3 + step
            gaps.append(pf.StepGap(run, workload, DISPATCH * issued, issued))
    if outlier:  # a recompile: 20x its op's time
        o = obs[0]
        obs.append(pf.Observation(o.run, o.workload, o.label, 9, o.op, o.kind, o.raw_s,
                                  o.runs, 20 * o.measured_s))  # fmt: skip
    return obs, gaps


@pytest.mark.parametrize("outlier", [False, True])
@pytest.mark.parametrize("runs", [(10, 11, 12), (10, 12), (8, 9, 10, 11)])
def test_the_fit_recovers_the_constants_that_made_the_observations(runs, outlier):
    obs, gaps = _observations(runs, outlier)
    c = pf.fit(obs, gaps)
    assert c.scales["vision_encode"] == pytest.approx(TRUE["vision_encode"][0], rel=1e-6)
    for kind in ("backward", "logprob_response"):
        assert c.scales[kind] == pytest.approx(TRUE[kind][0], rel=1e-6)
        assert c.fixed_s[kind] == pytest.approx(TRUE[kind][1], rel=1e-6)
    assert c.fixed_s["decode"] == pytest.approx(DECODE_FIXED, rel=1e-6)
    assert "decode" not in c.scales  # decode keeps the bare bandwidth efficiency
    assert c.dispatch_s == pytest.approx(DISPATCH, rel=1e-6)


def test_workloads_weigh_alike_however_often_measured():
    """One workload measured three times over does not outweigh another measured once."""
    obs, gaps = _observations((10, 11))
    many = [o for o in obs if o.run == 10 and o.kind == "vision_encode"] * 3
    slow = [pf.Observation(o.run, o.workload, o.label, o.step, o.op, o.kind, o.raw_s, o.runs,
                           o.measured_s * 2) for o in obs if o.run == 11]  # fmt: skip
    both = [o for o in obs if o.kind == "vision_encode" and o.run == 10] + [
        o for o in slow if o.kind == "vision_encode"
    ]
    once = pf.fit(both, gaps).scales["vision_encode"]
    thrice = pf.fit(both + many, gaps).scales["vision_encode"]
    assert thrice == pytest.approx(once, rel=1e-9)


def _spec(mean: int, cap: int) -> RunSpec:
    return RunSpec.model_validate(
        {
            "job": "plan",
            "algo": AlgoSpec().model_dump(),
            "schedule": ScheduleSpec(name="serial").model_dump(),
            "model": MODEL_PRESETS["qwen2_5_vl_7b"].model_dump(),
            "hardware": HARDWARE_PRESETS["h200"].model_dump(),
            "workload": {
                "prompts_per_step": 4,
                "group_size": 8,
                "frames": 8,
                "height": 448,
                "width": 448,
                "response_length": {"mean": mean, "max": cap, "sigma": 0.45},
            },
            "train": {"max_new_tokens": cap},
            "calibration": "none",
        }
    )


@pytest.mark.parametrize(("mean", "cap"), [(64, 256), (160, 512), (448, 1024)])
@pytest.mark.parametrize("step", [2, 3])
def test_a_steps_drawn_lengths_are_the_runtimes(mean, cap, step):
    spec = _spec(mean, cap)
    lengths = ResponseLengthSpec(mean=mean, max=cap, sigma=0.45)
    drawn = forced_lengths(lengths, 32, cap, spec.seed, step - 1)
    w = pr.drawn_workload(spec, step).response_length
    assert w.drawn == drawn
    assert w.expected_max(32) == max(drawn)
    assert w.survival(max(drawn)) == 0 and w.survival(0) == 1
    blocks = [max(drawn[i : i + 8]) for i in range(0, 32, 8)]
    assert w.expected_max(8) == pytest.approx(sum(blocks) / 4)
    # the plan at the drawn lengths decodes to their longest row
    bare = CostModel(spec.hardware)
    at_cap = pr.price(spec, bare, pr.drawn_workload(spec, 2)).ops["rollout.decode"][1]
    drawn_s = pr.price(spec, bare, pr.drawn_workload(spec, step)).ops["rollout.decode"][1]
    longest_at_2 = max(pr.drawn_workload(spec, 2).response_length.drawn)
    assert (drawn_s < at_cap) == (max(drawn) < longest_at_2)
