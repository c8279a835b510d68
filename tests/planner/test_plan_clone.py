"""Plan.clone (planner/plan.py): what `copy.deepcopy` gives, field for field, with nothing
mutable shared with the original, on plans of every schedule (offloads, micro-batches and
cross-group transfers included), so that the memory settler's trials stay independent."""

from __future__ import annotations

import copy
import dataclasses
from enum import Enum

import pytest

from rollplex.planner.plan import Plan
from rollplex.specs import WORKLOAD_PRESETS
from tests.planner.test_promises import hw, plan

VIDEO_8, IMAGE_4 = (
    WORKLOAD_PRESETS[name].model_copy(update={"prompts_per_step": n})
    for name, n in (("video", 8), ("image", 4))
)
CASES = {  # id -> (model, workload, hardware, schedule)
    "3b-video-rollplex": ("qwen2_5_vl_3b", VIDEO_8, hw("h200"), "rollplex"),
    "3b-image-offloads": ("qwen2_5_vl_3b", IMAGE_4, hw("h200", hbm_gib=60), "rollplex"),
    "3b-image-serial": ("qwen2_5_vl_3b", IMAGE_4, hw("h200"), "serial"),
    "7b-video-disaggregated": ("qwen2_5_vl_7b", "video", hw("h200x8"), "disaggregated"),
}


def _mutables(x: object, out: list[object]) -> list[object]:
    """Every list, dict and record reachable from `x` (strings, numbers, enums are shared
    by deepcopy too)."""
    if x is None or isinstance(x, (str, int, float, bool, Enum)):
        return out
    if not isinstance(x, tuple):
        out.append(x)
    if dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            _mutables(getattr(x, f.name), out)
    elif isinstance(x, dict):
        for v in x.values():
            _mutables(v, out)
    elif isinstance(x, (list, tuple, set)):
        for v in x:
            _mutables(v, out)
    return out


@pytest.mark.parametrize("case", CASES)
def test_a_clone_equals_a_deepcopy_and_shares_nothing_mutable(case: str) -> None:
    result = plan(*CASES[case])
    assert result is not None
    original: Plan = result.plan
    clone = original.clone()
    assert clone == copy.deepcopy(original) == original
    ids = {id(o) for o in _mutables(original, [])}
    assert not [type(o).__name__ for o in _mutables(clone, []) if id(o) in ids]
    # a trial's edits stay in the trial
    step = clone.devices[0].steps[0]
    step.start_s, step.waits = step.start_s + 1.0, [*step.waits, 10**6]
    clone.devices[0].arena_bytes[99] = 1
    clone.meta["trial"] = True
    assert original.devices[0].steps[0] != step and 99 not in original.devices[0].arena_bytes
    assert "trial" not in original.meta


def test_the_cases_cover_offloads_and_transfers() -> None:
    results = {case: plan(*args) for case, args in CASES.items()}
    steps = results["3b-image-offloads"].plan.devices[0].steps
    assert any(s.kind == "offload" for s in steps)
    assert results["7b-video-disaggregated"].plan.transfers
