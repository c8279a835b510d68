"""The one check of a train run (jobs/validate_run.py): each bad combination of spec and
process facts is refused by name, the same spec with that one field fixed passes, the
order is fixed, and nothing loads before the refusal."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rollplex.backends import ROLES
from rollplex.backends.base import BackendUnavailable
from rollplex.cli import _conf_dir
from rollplex.jobs.devices import device_refusal
from rollplex.jobs.validate_run import ORDER, RunFacts, run_facts, validate_run
from rollplex.specs import HARDWARE_PRESETS, role_needs
from rollplex.specs.hardware import DeviceInfo
from rollplex.specs.role_needs import NEEDS, RoleNeeds
from rollplex.specs.run import RunSpec

H200_PRESET = HARDWARE_PRESETS["h200"].model_dump()
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 85_031_714_816, 1)
FSDP = {"backend.trainer": "fsdp"}
SHARE2 = {**FSDP, "backend.fsdp.rollout_sync": "share", "backend.fsdp.rollout_tp": 2}
POOLED = {**FSDP, "schedule.name": "disaggregated"}
PPO = {"algo.name": "ppo"}
KL_IN_REWARD = {**PPO, "algo.use_reference": True, "algo.kl_coef": 0.01}
KL_IN_REWARD |= {"algo.kl_in_reward": True}


@functools.cache
def base() -> RunSpec:
    """`rollplex train` as conf/train.yaml has it (composed once: it costs ~1 s)."""
    with initialize_config_dir(config_dir=_conf_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["job=train"])
    raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    raw.pop("hydra", None)
    return RunSpec.model_validate(raw)


def spec(**dotted: Any) -> RunSpec:
    """The base spec with `dotted` fields ("backend.fsdp.rollout_tp") set, validated."""
    raw = base().model_dump()
    for path, value in dotted.items():
        *parents, leaf = path.split(".")
        node = raw
        for p in parents:
            node = node[p]
        node[leaf] = value
    return RunSpec.model_validate(raw)


def facts(**kw: Any) -> RunFacts:
    return RunFacts(**kw)


def cpu_only(device: str) -> RunFacts:
    return facts(device_refusal=device_refusal("train.device", device, False, 0, "2.13+cpu"))


# (case, the bad fields, the facts, what the refusal says, the fix that passes[, its facts])
BAD = [
    ("cuda on a CPU-only torch", {"train.device": "cuda"}, cpu_only("cuda"),
     "train.device=cuda: this torch (2.13+cpu) is a CPU-only build", {"train.device": "cpu"},
     facts()),
    ("fsdp, WORLD_SIZE not a number", FSDP, facts(world_size="four"),
     "WORLD_SIZE='four' is not a positive integer", {}, facts(world_size="4")),
    ("fsdp, RANK outside the world", FSDP, facts(world_size="2", rank="2"),
     "RANK='2' is not a rank of WORLD_SIZE=2", {}, facts(world_size="2", rank="1")),
    ("rollout TP over the world", SHARE2, facts(world_size="1"),
     "backend.fsdp.rollout_tp=2 does not divide the 1 torchrun ranks",
     {"backend.fsdp.rollout_tp": 1}),
    ("rollout TP without share", {**FSDP, "backend.fsdp.rollout_tp": 2}, facts(world_size="2"),
     "backend.fsdp.rollout_tp=2 needs backend.fsdp.rollout_sync=share (here gather)",
     {"backend.fsdp.rollout_sync": "share"}),
    ("two rollout TP degrees", {**SHARE2, "schedule.parallel.rollout_tp": 1},
     facts(world_size="2"), "schedule.parallel.rollout_tp=1 but the FSDP2 trainer's rollout",
     {"schedule.parallel.rollout_tp": None}),
    ("rollout TP with forced lengths", {**SHARE2, "train.response_lengths": "workload"},
     facts(world_size="2"), "train.response_lengths=workload with backend.fsdp.rollout_tp > 1",
     {"train.response_lengths": "model"}),
    ("prompts over the ranks", FSDP, facts(world_size="3"),
     "workload.prompts_per_step=4 does not divide over 3 torchrun ranks",
     {"workload.prompts_per_step": 6}),
    ("alias on two ranks", {**FSDP, "backend.fsdp.rollout_sync": "alias"}, facts(world_size="2"),
     "backend.fsdp.rollout_sync=alias needs 1 rank", {"backend.fsdp.rollout_sync": "gather"}),
    ("pools without torchrun", {**POOLED, "hardware.num_gpus": 2}, facts(),
     "at least 2 ranks (WORLD_SIZE=1)", {"schedule.name": "rollplex"}),
    ("pools for another world", {**POOLED, "hardware.num_gpus": 4}, facts(world_size="2"),
     "hardware.num_gpus=4 but torchrun's WORLD_SIZE=2", {"hardware.num_gpus": 2}),
    ("pools that leave no trainer", {**POOLED, "schedule.rollout_gpus": 2},
     facts(world_size="2"), "schedule.rollout_gpus=2 leaves no trainer",
     {"schedule.rollout_gpus": 1}),
    ("fsdp with batch-whitened advantages",
     {**FSDP, "algo.name": "reinforce_plus_plus_baseline"}, facts(),
     "algo.name=reinforce_plus_plus_baseline with backend.trainer=fsdp",
     {"algo.name": "grpo"}),
    ("fsdp ppo in pools", {**POOLED, **PPO, "hardware.num_gpus": 2}, facts(world_size="2"),
     "schedule.name=disaggregated with algo=ppo and backend.trainer=fsdp",
     {"schedule.name": "rollplex"}),
    ("fsdp with a vllm rollout", {**FSDP, "backend.rollout": "vllm"}, facts(),
     "backend.trainer=fsdp with backend.rollout=vllm, backend.reference=torch",
     {"backend.rollout": "torch"}),
    ("vllm unavailable", {"backend.rollout": "vllm"},
     facts(unavailable={"backend.rollout=vllm": "backend.rollout=vllm needs vllm: pip install"}),
     "backend.rollout=vllm needs vllm", {"backend.rollout": "torch"}),
    ("kl_in_reward with vllm", {**KL_IN_REWARD, "backend.rollout": "vllm"}, facts(),
     "algo.kl_in_reward with backend.rollout=vllm", {"backend.rollout": "torch"}),
    ("kl_in_reward with vllm's logprobs off", {**KL_IN_REWARD, "backend.rollout": "vllm"},
     facts(), "set backend.vllm.return_logprobs=true", {"backend.vllm.return_logprobs": True}),
    ("rollout correction with vllm's logprobs off",
     {"backend.rollout": "vllm", "algo.rollout_correction.rollout_is": "token"}, facts(),
     "algo.rollout_correction with backend.rollout=vllm", {"backend.vllm.return_logprobs": True}),
    ("vllm's logprobs under a nucleus",
     {"backend.rollout": "vllm", "backend.vllm.return_logprobs": True, "algo.top_p": 0.9},
     facts(), "backend.vllm.return_logprobs=true with algo.top_p=0.9", {"algo.top_p": 1.0}),
    ("triton knob on cpu", {"backend.torch_engine.split_gemm": True}, facts(triton=False),
     "backend.torch_engine.split_gemm=true with train.device=cpu",
     {"backend.torch_engine.split_gemm": None}),
    ("cap over the workload's responses",
     {"train.max_new_tokens": 32, "workload.response_length.max": 16},
     facts(keys=frozenset({"workload.response_length.max"})),
     "train.max_new_tokens=32 exceeds workload.response_length.max=16",
     {"train.max_new_tokens": 16}),
    ("rollout TP over the plan's GPUs", {"schedule.parallel.rollout_tp": 2}, facts(),
     "schedule.parallel.rollout_tp=2 exceeds the 1 GPUs", {"schedule.parallel.rollout_tp": 1}),
    ("mini-batch over the batch", {"algo.ppo_mini_batch_size": 5}, facts(),
     "algo.ppo_mini_batch_size=5 exceeds", {"algo.ppo_mini_batch_size": 4}),
    ("adaptive KL horizon under a step's rows",
     {**KL_IN_REWARD, "algo.kl_ctrl": "adaptive", "algo.kl_horizon": 12}, facts(),
     "algo.kl_horizon=12 with 64 rows per step", {"algo.kl_horizon": 13}),
    ("overlong buffer over the cap", {"reward.overlong_buffer": 1}, facts(),
     "reward.overlong_buffer=1 must be less than train.max_new_tokens=1",
     {"reward.overlong_buffer": 0}),
    ("a model dtype the torch roles do not hold", {"model.dtype": "bfloat16"},
     facts(keys=frozenset({"model.dtype"})),
     "model.dtype=bfloat16: the torch roles hold float32 parameters on train.device=cpu",
     {"model.dtype": "float32"}),
    ("float32 asked of the torch roles on a GPU",
     {"train.device": "cuda", "model.dtype": "float32"},
     facts(gpu=H100, keys=frozenset({"model.dtype"})),
     "model.dtype=float32: the torch roles hold bfloat16 parameters on train.device=cuda",
     {"model.dtype": "bfloat16"}),
    ("hardware that is not the device", {"train.device": "cuda", "hardware": H200_PRESET},
     facts(gpu=H100, keys=frozenset({"hardware"})), "hardware=h200 does not match the device",
     {}, facts(gpu=H100, keys=frozenset())),  # unset: read from the device
]  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_bad_combination_is_refused_by_name_and_its_fix_passes(case):
    _, given, bad_facts, says, fix, *fixed_facts = case
    with pytest.raises(ValueError) as e:  # BackendUnavailable is one too
        validate_run(spec(**given), bad_facts)
    assert says in str(e.value) and "\n" not in str(e.value)  # one line, naming the field
    # the same spec with that one field (or the fact) fixed passes
    validate_run(spec(**{**given, **fix}), fixed_facts[0] if fixed_facts else bad_facts)


@pytest.mark.parametrize(("world", "tp"), [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2)])
def test_a_good_torchrun_run_is_planned_for_its_world(world, tp):
    given = {**FSDP, "backend.fsdp.rollout_tp": tp}
    given |= {"backend.fsdp.rollout_sync": "share"} if tp > 1 else {}
    checks = validate_run(spec(**given), facts(world_size=str(world), rank=str(world - 1)))
    assert (checks.world, checks.rank) == (world, world - 1)
    assert checks.spec.hardware.num_gpus == world  # the plan is made for torchrun's world
    assert checks.spec.schedule.parallel.rollout_tp == tp  # at the rollout's own TP
    assert [n.where for n in checks.needs] == [
        "backend.trainer=fsdp", "backend.rollout=torch", "backend.reference=torch"
    ]  # fmt: skip


def test_a_single_process_run_ignores_the_world():
    """The torch trainer runs in one process: WORLD_SIZE is not read."""
    checks = validate_run(spec(), facts(world_size="four"))
    assert (checks.world, checks.rank) == (1, 0) and checks.spec == spec()


def test_the_first_refusal_in_order_wins():
    """Two bad fields: the one whose check comes first in ORDER is named."""
    both = {"train.device": "cuda", **KL_IN_REWARD, "backend.rollout": "vllm"}
    with pytest.raises(ValueError, match=r"train\.device=cuda"):
        validate_run(spec(**both), cpu_only("cuda"))
    gone = facts(unavailable={"backend.rollout=vllm": "vllm is not installed"})
    with pytest.raises(ValueError, match="kl_in_reward"):  # a role refusal before availability
        validate_run(spec(**KL_IN_REWARD, **{"backend.rollout": "vllm"}), gone)
    pooled = {**POOLED, **PPO, "hardware.num_gpus": 2, "algo.ppo_mini_batch_size": 5}
    with pytest.raises(ValueError, match=r"disaggregated with algo=ppo and backend\.trainer"):
        validate_run(spec(**pooled), facts(world_size="2"))
    assert (
        ORDER.index("role refusals") < ORDER.index("roles available") < ORDER.index("mini-batches")
    )


@pytest.mark.parametrize("trainer", ["torch", "fsdp"])
def test_a_ppo_run_may_resume_with_either_trainer(trainer):
    """Both trainers' checkpoints hold the critic: whether one can be resumed is the
    checkpoint's check (runtime/checkpoint.py and dcp_checkpoint.py; tests/jobs/
    test_ppo_resume.py, tests/distributed/test_ppo_resume.py), not the spec's."""
    given = {**PPO, "backend.trainer": trainer, "train.resume": "/some/run"}
    checks = validate_run(spec(**given), facts())
    assert checks.spec.train.resume == "/some/run" and checks.spec.algo.name == "ppo"


def test_the_fsdp_trainer_runs_the_adaptive_reward_kl():
    """Its controller sees the whole batch's KL, summed over the ranks (role_free.py;
    tests/distributed/test_ppo_resume.py): no longer refused from the spec."""
    adaptive = {**FSDP, **KL_IN_REWARD, "algo.kl_ctrl": "adaptive"}
    checks = validate_run(spec(**adaptive), facts(world_size="2"))
    assert checks.spec.algo.kl_ctrl == "adaptive" and checks.world == 2


def test_every_registered_role_declares_its_needs():
    assert set(NEEDS) == {(role, name) for role in ROLES for name in ROLES[role]}
    for (role, name), needs in NEEDS.items():
        assert (needs.role, needs.name) == (role, name)
        assert set(needs.devices) <= {"cpu", "cuda"}


def test_a_declared_device_kind_is_read(monkeypatch):
    cuda_only = RoleNeeds("reference", "torch", devices=("cuda",))
    monkeypatch.setitem(role_needs.NEEDS, ("reference", "torch"), cuda_only)
    with pytest.raises(ValueError, match=r"reference=torch runs on cuda, not train\.device"):
        validate_run(spec(), facts())


@pytest.mark.parametrize(
    ("device", "built", "count", "says"),
    [
        ("cpu", False, 0, None),
        ("cuda", True, 1, None),
        ("cuda:1", True, 2, None),
        ("tpu", True, 1, "not a device rollplex runs on"),
        ("meta", True, 1, "rollplex runs on cpu or cuda, not meta"),
        ("cuda", False, 0, "CPU-only build"),
        ("cuda", True, 0, "no CUDA device is visible"),
        ("cuda:2", True, 2, "only 2 CUDA device(s) are visible"),
    ],
)
def test_the_device_refusal_reads_plain_facts(device, built, count, says):
    why = device_refusal("train.device", device, built, count, "2.13")
    assert (why is None) if says is None else (f"train.device={device}" in why and says in why)


def test_the_facts_name_a_role_that_is_not_installed(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a)
    )
    found = run_facts(spec(**{"backend.rollout": "vllm"}))
    assert "pip install vllm" in found.unavailable["backend.rollout=vllm"]
    with pytest.raises(BackendUnavailable, match=r"backend\.rollout=vllm needs vllm"):
        validate_run(spec(**{"backend.rollout": "vllm"}), found)


def test_nothing_loads_before_a_refusal(tmp_path: Path, monkeypatch):
    """The train job refuses at its edge: no data, plan or model is touched."""
    import rollplex.jobs.pipeline as pipeline
    import rollplex.jobs.prepare as prepare
    import rollplex.runtime.compose as compose_module
    from rollplex.jobs.train import run_train

    def loaded(*_: Any, **__: Any) -> None:
        raise AssertionError("loaded before the refusal")

    for module, name in ((prepare, "prepare"), (pipeline, "plan_step"),
                         (compose_module, "compose")):  # fmt: skip
        monkeypatch.setattr(module, name, loaded)
    monkeypatch.setenv("WORLD_SIZE", "3")
    for bad, says in (
        ({**KL_IN_REWARD, "backend.rollout": "vllm"}, "kl_in_reward with backend.rollout=vllm"),
        (FSDP, "prompts_per_step=4 does not divide over 3"),
        ({"schedule.parallel.train_tp": 2}, "train_tp=2 exceeds"),
        ({"backend.torch_engine.skinny_gemm": True}, "skinny_gemm=true with train.device=cpu"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            run_train(spec(**bad), tmp_path)
    assert not (tmp_path / "plan.json").exists()


def test_the_eval_job_names_a_missing_role_before_any_weights_load(tmp_path: Path, monkeypatch):
    """compose() no longer re-checks the roles: the eval job checks them at its own edge."""
    import importlib.util

    import rollplex.runtime.compose as compose_module
    from rollplex.jobs.eval import run_eval

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a)
    )
    monkeypatch.setattr(compose_module, "compose", lambda *_, **__: pytest.fail("loaded"))
    with pytest.raises(BackendUnavailable, match="pip install vllm"):
        run_eval(spec(**{"job": "eval", "backend.rollout": "vllm"}), tmp_path)
