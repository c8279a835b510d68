"""PPO steps through the plan, run the same way by one torch process (test_ppo.py, in the
test's own process) and by every rank of the fsdp trainer (worker.py `ppo`).

Both draw one generator per sample (FsdpHooks), so the sampled tokens do not depend on
which process decodes a sample; the report holds the policy's and the critic's full
parameters, the per-step value loss, and what this rank holds of the critic.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rollplex.backends.fsdp.build import FsdpHooks
from rollplex.backends.fsdp.shard import full, local
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from rollplex.specs.backend import BackendSpec
from rollplex.specs.schedule import ScheduleSpec

MODEL, WORKLOAD = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"]
# conftest.py's runs' learning rate (test_equivalence's tolerance is set against it), for
# the critic too; weight decay moves every weight at every step, learning signal or not.
ALGO = AlgoSpec(name="ppo", lr=3e-4, critic_lr=3e-4, weight_decay=0.1)
# the KL in the reward under the adaptive controller: its coefficient moves at every step
# (kl_horizon=10 over 16 rows), by an amount that the second step's KL sets (|old - ref|
# about 0.13, inside the controller's +-20% band around target_kl)
ADAPTIVE = AlgoSpec(**{**ALGO.model_dump(), "kl_coef": 0.05, "kl_in_reward": True,
                       "kl_penalty": "abs", "kl_ctrl": "adaptive", "target_kl": 0.12,
                       "kl_horizon": 10})  # fmt: skip


def setup(trainer: str, micro_tokens: int | None = None, algo: AlgoSpec = ALGO):
    """(roles, the plan, the data) of a PPO run (serial schedule) with
    backend.trainer=`trainer`. `micro_tokens`: the schedule's train_micro_tokens (default:
    one micro-batch)."""
    b = compose(StepConfig(MODEL, algo, 0, 4), BackendSpec(trainer=trainer))
    if trainer == "torch":  # the fsdp trainer's per-sample generators, on one process
        b.roles.hooks = FsdpHooks(0, 0, 1)
    micro = {} if micro_tokens is None else {"train_micro_tokens": micro_tokens}
    serial = ScheduleSpec(name="serial", **micro)
    planned = plan_step(MODEL, WORKLOAD, algo, HARDWARE_PRESETS["cpu"], serial)
    return b, planned, TaskData(MODEL, WORKLOAD, seed=0)


def run_ppo(
    trainer: str, steps: int, micro_tokens: int | None = None, algo: AlgoSpec = ALGO
) -> dict:
    """`steps` PPO steps with backend.trainer=`trainer` (`setup`'s); the report."""
    b, planned, data = setup(trainer, micro_tokens, algo)
    ex = Executor(planned.plan, planned.graph, b)  # binds the graph: builds the critic
    critic = b.critic
    start = {"policy": _full(b.trainer.model), "critic": _full(critic.model)}
    metrics = [ex.run_step(k, data.step(k)).metrics for k in range(steps)]
    return {
        "metrics": metrics,
        "start": start,
        "policy": _full(b.trainer.model),
        "critic": _full(critic.model),
        "critic_version": critic.counter.n,
        "reward_kl_coef": b.role_free.reward_kl_coef(),  # the next step's (None: fixed)
        # the plan's training micro-batches as each model was given them (runtime/dispatch)
        "micro_batches": (b.trainer.micro_batches, critic.micro_batches),
        "holds": _holds(critic),
    }


def _full(model) -> dict[str, torch.Tensor]:
    """Every parameter, gathered (a collective per sharded one)."""
    return {n: full(p.detach()).clone() for n, p in model.named_parameters()}


def _holds(critic) -> dict[str, dict]:
    """Per critic parameter: its full and local shapes, and the local shapes of its AdamW
    state (this rank's)."""
    out = {}
    for name, p in critic.model.named_parameters():
        state = critic.optimizer.state.get(p, {})
        out[name] = {
            "full": tuple(p.shape),
            "local": tuple(local(p.detach()).shape),
            "adam": {k: tuple(local(v).shape) for k, v in state.items() if v.dim() > 0},
        }
    return out


def rank_report(steps: int, micro_tokens: int | None = None) -> dict:
    """worker.py `ppo`: this rank's report of the fsdp trainer's run."""
    report = run_ppo("fsdp", steps, micro_tokens)
    report.update(rank=dist.get_rank(), world=dist.get_world_size())
    return report


__all__ = ["ADAPTIVE", "ALGO", "MODEL", "WORKLOAD", "rank_report", "run_ppo", "setup"]


if __name__ == "__main__":  # a look by hand: python -m tests.distributed.ppo_checks
    torch.set_num_threads(1)
    print({k: v for k, v in run_ppo("torch", 2).items() if k == "metrics"})
