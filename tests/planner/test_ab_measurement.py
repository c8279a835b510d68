"""bench/ab.py: the A/B rules bench/gpu_step.py measures schedules by (issue 31.4).

Alternating round order, each ratio with its half-width over rounds, and two plans of the
same placement reported as one plan, on plans the planner really makes."""

from __future__ import annotations

import copy
import itertools
import json
import sys
from pathlib import Path

import pytest

from rollplex.planner.plan import dump_plan
from tests.planner.conftest import plan_7b

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import ab


@pytest.mark.parametrize("names", [["a", "b"], ["serial_dedup", "verl", "rollplex"]])
@pytest.mark.parametrize("rounds", [2, 3, 4])
def test_rounds_alternate_and_no_schedule_is_always_first(names, rounds):
    orders = ab.round_orders(names, rounds)
    assert len(orders) == rounds
    assert all(sorted(o) == sorted(names) for o in orders)
    assert all(orders[r + 1] == orders[r][::-1] for r in range(rounds - 1))
    # over any two consecutive rounds every schedule runs once early, once late
    for a, b in itertools.pairwise(orders):
        for n in names:
            assert a.index(n) + b.index(n) == len(names) - 1


def test_timed_rounds_run_the_variants_in_the_alternating_order(tmp_path, capsys):
    ran: list[str] = []

    def variant(name: str, seconds: float):
        return lambda: ran.append(name) or seconds

    t = ab.timed_rounds({"a": variant("a", 2.0), "b": variant("b", 1.0)}, 4)
    assert ran == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert t == {"a": [2.0] * 4, "b": [1.0] * 4}
    ab.report(["# x", "y"], tmp_path / "r.md")
    assert (tmp_path / "r.md").read_text() == "# x\ny\n" and "# x\ny" in capsys.readouterr().out


@pytest.mark.parametrize(("unit", "row", "saved"), [("s", "| 1 | 0.300 | 0.100 | 3.00 |",
                                                      "0.15 s saved per run"),
                                                     ("ms", "| 1 | 300.0 | 100.0 | 3.00 |",
                                                      "150 ms saved per run")])  # fmt: skip
def test_a_pair_report_has_each_round_the_ratio_and_the_time_saved(tmp_path, unit, row, saved):
    md = tmp_path / "pair.md"
    ab.pair_report("T", "how", ("old", [0.2, 0.3]), ("new", [0.1, 0.1]), md, notes=["n"], unit=unit)
    lines = md.read_text().splitlines()
    assert lines[0] == "# T" and lines[2].endswith("bench/ab.py; how).") and lines[3] == "n"
    assert f"| round | old ({unit}) | new ({unit}) | ratio |" in lines and row in lines
    assert lines[-1] == f"Ratio 2.50 +- 0.50 (mean over rounds +- half-width); {saved} (mean)."


@pytest.mark.parametrize("rounds", [0, 1])
def test_one_round_is_refused(rounds):
    with pytest.raises(ValueError, match="at least 2 rounds"):
        ab.round_orders(["a", "b"], rounds)


def test_duplicate_schedules_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        ab.round_orders(["a", "a"], 2)


@pytest.mark.parametrize(
    ("base", "cand"),
    [([2.0, 2.2], [1.0, 1.0]), ([5.58, 5.40, 5.50], [5.0, 5.2, 4.9]), ([1.0, 1.0], [1.0, 1.0])],
)
def test_ratio_is_the_mean_over_rounds_with_its_half_width(base, cand):
    r = ab.ratio_over_rounds(base, cand)
    per = [b / c for b, c in zip(base, cand, strict=True)]
    assert r.per_round == pytest.approx(per)
    assert r.value == pytest.approx(sum(per) / len(per))
    assert r.spread == pytest.approx((max(per) - min(per)) / 2)
    assert min(per) <= r.value <= max(per)
    assert r.beyond_noise == (r.value - r.spread > 1.0)


def test_a_gain_inside_the_band_is_not_beyond_noise():
    # the case: 1.080 and 1.034 for one placement
    r = ab.ratio_over_rounds([1.080, 1.034], [1.0, 1.0])
    assert r.spread == pytest.approx(0.023)
    assert r.beyond_noise  # 1.057 - 0.023 > 1: two rounds alone do not expose it ...
    same = ab.ratio_over_rounds([1.080, 1.034], [1.0, 1.0], same_plan=True)
    assert same.value is None and not same.beyond_noise  # ... the same-plan check does
    assert same.as_json()["same_plan"] is True
    assert not ab.ratio_over_rounds([1.04, 0.98], [1.0, 1.0]).beyond_noise


@pytest.mark.parametrize(
    ("base", "cand", "match"),
    [([1.0], [1.0], "at least 2"), ([1.0, 1.0], [1.0], "rounds differ"), ([1, 0], [1, 1], "pos")],
)
def test_bad_rounds_are_refused(base, cand, match):
    with pytest.raises(ValueError, match=match):
        ab.ratio_over_rounds(base, cand)


@pytest.fixture(scope="module")
def plans() -> dict[str, dict]:
    return {
        "serial_dedup": json.loads(dump_plan(plan_7b("serial").plan)),
        # overlap that must gain 99% never does: the serial+dedup placement is kept
        "rollplex_kept": json.loads(dump_plan(plan_7b("rollplex", overlap_min_gain=0.99).plan)),
        "rollplex_streams": json.loads(dump_plan(plan_7b("rollplex", overlap="streams").plan)),
        "verl": json.loads(dump_plan(plan_7b("serial", dedup=False).plan)),
    }


def test_a_kept_serial_placement_is_the_same_plan(plans):
    assert plans["rollplex_kept"]["schedule"] != plans["serial_dedup"]["schedule"]
    assert ab.same_plan(plans["serial_dedup"], plans["rollplex_kept"])


def test_different_placements_are_different_plans(plans):
    assert not ab.same_plan(plans["serial_dedup"], plans["rollplex_streams"])
    assert not ab.same_plan(plans["serial_dedup"], plans["verl"])


def test_packed_and_padded_rows_are_different_plans():
    # one placement, but packing changes every response forward's work (issue 31 A/B)
    packed, padded = (
        json.loads(dump_plan(plan_7b("serial", pack_responses=p).plan)) for p in (True, False)
    )
    assert ab.placement(packed)[1:] == ab.placement(padded)[1:]
    assert not ab.same_plan(packed, padded)


def test_times_and_notes_do_not_make_a_new_plan_but_a_stream_does(plans):
    base = plans["serial_dedup"]
    retimed = copy.deepcopy(base)
    retimed["step_time_s"] *= 2
    retimed["notes"].append("calibrated")
    for s in retimed["devices"][0]["steps"]:
        s["solo_s"] *= 1.7
        s["end_s"] += 1.0
    assert ab.same_plan(base, retimed)
    moved = copy.deepcopy(base)
    moved["devices"][0]["steps"][-1]["stream"] += 1
    assert not ab.same_plan(base, moved)
    attached = copy.deepcopy(base)  # prefill_once: the same op name, another kind
    step = next(s for s in attached["devices"][0]["steps"] if s["op"] == "train.logprob_prefix")
    step["kind"] = "attach_prefix"
    assert not ab.same_plan(base, attached)
    swapped = copy.deepcopy(base)
    steps = swapped["devices"][0]["steps"]
    steps[0]["index"], steps[1]["index"] = steps[1]["index"], steps[0]["index"]
    assert not ab.same_plan(base, swapped)


def _entry(times: list[float], plan: str = "p") -> dict:
    return {"step_time_s": times, "placement_hash": plan}


def test_paired_seconds_sum_the_same_steps_of_every_run():
    runs = {
        "a": [_entry([9.0, 2.0, 3.0]), {"error": "OOM"}],
        "b": [_entry([8.0, 1.0, 1.5, 7.0]), _entry([5.0, 1.0, 1.0])],
    }
    # steps 2..3 (the shortest run has 3); the first step of each run is left out
    assert ab.paired_seconds(runs, 2) == {"a": [5.0, None], "b": [2.5, 2.0]}
    assert ab.paired_seconds(runs, 1) == {"a": [14.0, None], "b": [10.5, 7.0]}


def test_compare_uses_the_rounds_both_completed():
    runs = {
        "base": [_entry([1, 2.2]), _entry([1, 2.0]), _entry([1, 2.1])],
        "cand": [_entry([1, 2.0], "q"), {"error": "OOM"}, _entry([1, 1.0], "q")],
    }
    r = ab.compare(runs, ab.paired_seconds(runs), "base", "cand")
    assert r["per_round"] == pytest.approx([1.1, 2.1])  # round 1 failed: left out
    assert r["same_plan"] is False and r["plans"] == {"base": ["p"], "cand": ["q"]}
    assert ab.compare(runs, ab.paired_seconds(runs), "base", "absent") is None


def test_compare_reports_one_placement_as_the_same_plan_and_too_few_rounds_as_such():
    same = {"a": [_entry([1, 2.0]), _entry([1, 2.2])], "b": [_entry([1, 2.1]), _entry([1, 2.0])]}
    r = ab.compare(same, ab.paired_seconds(same), "a", "b")
    assert r["same_plan"] is True and r["value"] is None and r["per_round"]
    moved = {**same, "b": [_entry([1, 2.1]), _entry([1, 2.0], "other")]}  # replanned: not same
    assert ab.compare(moved, ab.paired_seconds(moved), "a", "b")["same_plan"] is False
    short = {"a": [_entry([1, 2.0]), {"error": "x"}], "b": same["b"]}
    assert (
        "1 complete round(s), need 2"
        in ab.compare(short, ab.paired_seconds(short), "a", "b")["error"]
    )


@pytest.mark.parametrize(
    ("elapsed", "walls", "budget", "starts"),
    [
        (226.0, [36.0, 100.0], 300.0, False),  # run 16: round 1 could not finish
        (140.0, [36.0, 100.0], 300.0, True),
        (164.0, [36.0, 100.0], 300.0, True),  # exactly fits
        (1e6, [36.0, 100.0], None, True),  # no budget: every round runs
    ],
)
def test_a_round_that_cannot_finish_in_the_budget_does_not_start(elapsed, walls, budget, starts):
    why = ab.round_skip(elapsed, walls, budget)
    assert (why == "") == starts
    if not starts:
        assert "round 0 took 136 s" in why and "74 s of --budget-s 300" in why
