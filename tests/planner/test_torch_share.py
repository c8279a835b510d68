"""The FSDP2 shared torch rollout (`backend.fsdp.rollout_sync=share`) is charged its own
layout's bytes (weights/torch_rollout.py: torch's TP plan, vision and norms replicated,
strided ranks, its own compute-dtype copy of the shards), not the layout algebra's best
vLLM-style layout; the gathered replica (`rollout_sync=gather`) the whole model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from rollplex.backends import rollout_capabilities
from rollplex.graph.ir import Value, ValueKind
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.cost_model import CostModel
from rollplex.planner.plan import DevicePlan
from rollplex.planner.shared_weights import (
    MASTER_ITEMSIZE,
    alias_sync_bytes,
    rollout_copy_bytes,
    weights_layout,
)
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.backend import BackendSpec
from rollplex.specs.roles import FSDP_ROLLOUTS, TORCH_ROLLOUT
from rollplex.weights import LayoutError
from rollplex.weights.rebuild import rebuild_plan
from rollplex.weights.torch_rollout import aliased, rollout_sharing, torch_rollout_bytes

GIB = 1 << 30
SHARE, GATHER = FSDP_ROLLOUTS["share"], FSDP_ROLLOUTS["gather"]


def _values(spec) -> dict[str, Value]:
    """A weights value per tower, and one holding both (a trainable vision tower)."""
    llm, vision = spec.llm_param_count(), spec.vision.param_count()
    return {
        tower: Value(f"{tower}.weights", (n,), spec.dtype, ValueKind.WEIGHTS)
        for tower, n in (("llm", llm), ("vision", vision), ("both", llm + vision))
    }


def _grid() -> list[tuple[str, int, int, str]]:
    out = []
    for model in ("tiny", "qwen2_5_vl_3b", "qwen2_5_vl_7b"):
        for world in (1, 2, 4, 8):
            for tp in sorted({1, 2, world}):
                if world % tp == 0:
                    out += [(model, world, tp, dtype) for dtype in ("float32", "bfloat16")]
    return out


@pytest.mark.parametrize("model, world, tp, dtype", _grid())
def test_charged_copy_is_what_the_shared_rollout_adds(model, world, tp, dtype):
    """Per GPU, the planner's rollout copy of each weights value is the most any rank adds
    (`extra_bytes`: rebuilt tensors plus the bf16 shard copy when the masters are cast),
    computed on the whole model here and on one layer per class in the planner; a weight
    sync moves in what `received_bytes` says, every rank."""
    spec = MODEL_PRESETS[model].model_copy(update={"dtype": dtype})
    values, cast = _values(spec), dtype != "float32"
    try:
        sharing = rollout_sharing(spec, world, tp, dtype)
    except LayoutError:  # torch's plan cannot split the model: the whole shard, as an engine
        for v in values.values():
            charged = rollout_copy_bytes(spec, v, world, 1, tp, True, "torch_tp")
            assert charged == math.ceil(v.nbytes / tp)
        return
    towers = {"llm": ("llm",), "vision": ("vision",), "both": None}
    for key, v in values.items():
        ranks = [torch_rollout_bytes(sharing, g, cast, towers=towers[key]) for g in range(world)]
        charged = rollout_copy_bytes(spec, v, world, 1, tp, True, "torch_tp")
        assert charged == max(b["extra_bytes"] for b in ranks), key
    # a sync refills and recasts both towers whichever value it updates
    whole = [torch_rollout_bytes(sharing, g, cast) for g in range(world)]
    moves = alias_sync_bytes(spec, values["llm"], world, 1, tp, "torch_tp")
    assert moves is not None
    assert [r for r, _ in moves] == [b["received_bytes"] for b in whole]
    item = sharing.itemsize
    recast = [(b["compute_copy_bytes"] + b["placed_bytes"]) // item for b in whole]
    assert [c for _, c in moves] == [
        b["local_copy_bytes"] + n * (MASTER_ITEMSIZE + item) // 2
        for b, n in zip(whole, recast, strict=True)
    ]
    if world == 1 and not cast:  # the one float32 shard is every tensor: nothing added
        assert rollout_copy_bytes(spec, values["both"], 1, 1, 1, True, "torch_tp") == 0


def _plan(
    model: str, hardware: str, gpus: int, tp: int, caps, name="serial", prompts=None
) -> PlanResult:
    hw = HARDWARE_PRESETS[hardware].model_copy(update={"num_gpus": gpus})
    work = WORKLOAD_PRESETS["tiny" if model == "tiny" else "video"]
    if prompts:
        work = work.model_copy(update={"prompts_per_step": prompts})
    sched = ScheduleSpec(name=name, parallel={"rollout_tp": tp})
    spec = MODEL_PRESETS[model]
    return plan_step(spec, work, AlgoSpec(), hw, sched, enforce_budget=False, rollout=caps)


def _copies(dev: DevicePlan) -> dict[str, int]:
    return {s.value: s.size for s in dev.slots if s.value_kind == "rollout_weights"}


@pytest.mark.parametrize(
    "model, hardware, gpus, tp", [("qwen2_5_vl_3b", "h200x8", 2, 2), ("tiny", "cpu", 1, 1)]
)
def test_share_plan_peaks_below_gather_by_the_copy_it_saves(model, hardware, gpus, tp):
    """Same graph, same TP: the shared rollout's plan holds `extra_bytes` per GPU where the
    gathered one holds the whole model, both all step (neither FSDP2 rollout frees its
    storage after the rollout), so the peaks differ by exactly that. Half the video preset's
    prompts: at all of them the gathered plan (147.7 GB of 150 GB) offloads to fit once its
    scoring ops' scratch is priced at their padded width, and the peaks differ by less."""
    prompts = 64 if model != "tiny" else None
    share = _plan(model, hardware, gpus, tp, SHARE, prompts=prompts)
    # The gathered rollout decodes with the torch engine and so also holds its static
    # workspace all step (static_kv); with the share mode's decode on both sides, what
    # differs is the copy alone.
    gather = _plan(model, hardware, gpus, tp, replace(GATHER, static_kv=False), prompts=prompts)
    engine = _plan(model, hardware, gpus, tp, GATHER, prompts=prompts)
    (s,), (g,), (e,) = share.plan.devices, gather.plan.devices, engine.plan.devices
    assert not any(x.kind == "offload" for d in (s, g) for x in d.steps)  # both hold it all
    assert e.peak_bytes >= g.peak_bytes
    spec = MODEL_PRESETS[model]
    sharing = rollout_sharing(spec, gpus, tp, spec.dtype)
    extra = max(
        torch_rollout_bytes(sharing, r, spec.dtype != "float32")["extra_bytes"] for r in range(gpus)
    )
    replica = sharing.param_bytes()
    assert (
        set(_copies(s)) == set(_copies(g)) == {"policy.weights@rollout", "vision.weights@rollout"}
    )
    assert sum(_copies(s).values()) == extra  # the ranks are alike: the towers' maxima add
    assert sum(_copies(g).values()) == replica
    assert g.peak_bytes - s.peak_bytes == replica - extra > 0


def test_3b_on_two_gpus_is_charged_what_was_measured():
    """bench/results/fsdp_share: 4.12 GiB per GPU added at TP 2, 6.99 GiB for gather and
    for share at TP 1 (a full replica per GPU needs the other rank's half anyway)."""
    tp2 = sum(_copies(_plan("qwen2_5_vl_3b", "h200x8", 2, 2, SHARE).plan.devices[0]).values())
    tp1 = sum(_copies(_plan("qwen2_5_vl_3b", "h200x8", 2, 1, SHARE).plan.devices[0]).values())
    assert round(tp2 / GIB, 2) == 4.12 and round(tp1 / GIB, 2) == 6.99
    notes = _plan("qwen2_5_vl_3b", "h200x8", 2, 2, SHARE).plan.notes
    (note,) = [n for n in notes if n.startswith("rollout weights read from the FSDP2 shards")]
    assert "4.12 GiB per GPU added" in note and "6.99 GiB for a full replica" in note


def test_the_algebra_layout_still_prices_the_vllm_style_rollout():
    """The default (a rollout reading the algebra's best layout) keeps its own numbers: at
    FSDP 8 / TP 8 on 32B it rebuilds almost nothing, where the torch rollout adds its
    bf16 copy of the shards (7.6 GiB of LLM)."""
    algebra = _copies(_plan("qwen2_5_vl_32b", "h200x8", 8, 8, TORCH_ROLLOUT).plan.devices[0])
    torch = _copies(_plan("qwen2_5_vl_32b", "h200x8", 8, 8, SHARE).plan.devices[0])
    assert algebra["policy.weights@rollout"] < GIB / 100 < 7 * GIB < torch["policy.weights@rollout"]
    assert "policy.weights@rollout.next" in algebra  # dropped after the rollout, rebuilt


def test_shared_sync_is_priced_from_what_moves():
    r = _plan("qwen2_5_vl_3b", "h200x8", 2, 2, SHARE)
    spec, hw = MODEL_PRESETS["qwen2_5_vl_3b"], HARDWARE_PRESETS["h200x8"]
    moves = alias_sync_bytes(spec, r.graph.values["policy.weights"], 2, 1, 2, "torch_tp")
    assert moves is not None
    link, hbm = hw.nvlink_gbps * 1e9, hw.hbm_bandwidth_gbps * 1e9
    want = max(a / link + 2 * c / hbm for a, c in moves) + CostModel(hw).launch_s
    sync = next(s.solo_s for d in r.plan.devices for s in d.steps if s.kind == "weight_sync")
    assert sync == pytest.approx(want)


def test_gathered_replica_sync_moves_every_master_and_casts_it():
    """rollout_sync=gather: each rank all-gathers every float32 master (both towers: the
    runtime refills the whole model) and casts it into its bf16 model; only the local 1/N
    does not cross NVLink. Dearer than the shared rollout's sync, at any TP."""
    spec, hw = MODEL_PRESETS["qwen2_5_vl_3b"], HARDWARE_PRESETS["h200x8"]
    n = spec.param_count()
    link, hbm = hw.nvlink_gbps * 1e9, hw.hbm_bandwidth_gbps * 1e9
    want = n * 4 / 2 / link + 2 * n * (4 + 2) / 2 / hbm + CostModel(hw).launch_s

    def sync_s(r: PlanResult) -> float:
        return next(s.solo_s for d in r.plan.devices for s in d.steps if s.kind == "weight_sync")

    gather = _plan("qwen2_5_vl_3b", "h200x8", 2, 1, GATHER)
    assert sync_s(gather) == pytest.approx(want)
    for tp in (1, 2):
        assert sync_s(_plan("qwen2_5_vl_3b", "h200x8", 2, tp, SHARE)) < sync_s(gather)


def test_the_fsdp_trainers_rollout_says_how_it_holds_the_weights():
    fsdp = {"trainer": "fsdp"}
    layouts = {
        sync: rollout_capabilities(BackendSpec(**fsdp, fsdp={"rollout_sync": sync})).weights_layout
        for sync in ("share", "gather", "alias")
    }
    assert layouts == {"share": "torch_tp", "gather": "replica", "alias": "algebra"}
    assert rollout_capabilities(BackendSpec()).weights_layout == "algebra"
    assert rollout_capabilities(BackendSpec(rollout="vllm")).weights_layout == "engine"
    # the graph carries the choice to the planner, on the weight_sync
    for caps, layout, mode in ((SHARE, "torch_tp", "alias"), (GATHER, "replica", "load")):
        g = _plan("tiny", "cpu", 1, 1, caps).graph
        (sync,) = [op for op in g if op.kind == "weight_sync"]
        assert (sync.attrs.get("layout"), sync.attrs["mode"]) == (layout, mode)
        assert weights_layout(g) == layout
    assert weights_layout(_plan("tiny", "cpu", 1, 1, TORCH_ROLLOUT).graph) == "algebra"


def _shallow(model: str, dtype: str):
    """`model`'s widths with 2 decoder layers and 2 vision blocks (fast to list runs of)."""
    spec = MODEL_PRESETS[model]
    vision = spec.vision.model_copy(update={"depth": 2, "fullatt_block_indexes": ()})
    return spec.model_copy(update={"num_layers": 2, "vision": vision, "dtype": dtype})


@pytest.mark.parametrize(
    "model, world, tp, dtype",
    [("tiny", 2, 2, "float32"), ("qwen2_5_vl_3b", 4, 2, "bfloat16"),
     ("qwen2_5_vl_3b", 4, 1, "float32"), ("qwen2_5_vl_7b", 2, 2, "bfloat16")],
)  # fmt: skip
def test_sync_bytes_are_what_the_rebuild_plans_copy(model, world, tp, dtype):
    """`torch_rollout_bytes` counts received and locally copied bytes by arithmetic; the
    exchange (backends/fsdp/exchange.py) runs `rebuild_plan`'s copies: the same bytes."""
    spec, cast = _shallow(model, dtype), dtype != "float32"
    sharing = rollout_sharing(spec, world, tp, dtype)
    for g in range(world):
        got = torch_rollout_bytes(sharing, g, cast)
        received = copied = 0
        for name in sharing.tensors:
            if aliased(sharing, name, g):
                continue
            for c in rebuild_plan(sharing, name, g, in_place=cast):
                received += c.nbytes * (c.gpu != g)
                copied += c.nbytes * (c.gpu == g)
        assert (got["received_bytes"], got["local_copy_bytes"]) == (received, copied)
        assert received > 0 or world == 1
