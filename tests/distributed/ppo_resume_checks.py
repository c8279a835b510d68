"""PPO under the fsdp trainer stopped at a DCP checkpoint and resumed (worker.py
`ppo-resume`), through the train job's own save and resume (jobs/train_loop.py `_save`,
`_resume`: the critic built before the restore, the rollout given the restored weights).

Three runs on fresh roles, every rank alike: K steps straight through; the first S steps,
then a checkpoint; a resume from it to K. PPO with the KL in the reward under the adaptive
controller (ppo_checks.ADAPTIVE), whose coefficient the checkpoint carries. Each report
holds the gathered policy and critic, both AdamW states gathered, and the metrics of every
step run.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from rollplex.backends.fsdp.shard import full
from rollplex.jobs import train_loop
from rollplex.runtime import Executor
from rollplex.runtime.dcp_checkpoint import read_dcp_checkpoint
from rollplex.specs import AlgoSpec
from tests.distributed.ppo_checks import ADAPTIVE, MODEL, setup


def resume_report(steps: int, stop: int, folder: Path, algo: AlgoSpec = ADAPTIVE) -> dict:
    """worker.py `ppo-resume`: this rank's report of the three runs; the checkpoint is
    written under `folder`."""
    straight = _run(algo, steps)
    stopped = _run(algo, stop, save_to=folder)
    ckpt = read_dcp_checkpoint(stopped["saved"], MODEL, seed=0, critic=True)
    resumed = _run(algo, steps, ckpt=ckpt)
    return {
        "straight": straight,
        "stopped": stopped,
        "resumed": resumed,
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
    }


def _run(algo: AlgoSpec, last: int, ckpt=None, save_to: Path | None = None) -> dict:
    """Steps from the checkpoint's (or 0) to `last`, as the train job runs them."""
    b, planned, data = setup("fsdp", algo=algo)
    # what the loop's _save and _resume read of the run's spec and prepared data
    fsdp, steps = SimpleNamespace(trainer="fsdp"), SimpleNamespace(steps=last)
    spec = SimpleNamespace(seed=0, algo=algo, backend=fsdp, train=steps)
    prepared = SimpleNamespace(model=MODEL)
    main = dist.get_rank() == 0
    run = train_loop.TrainRun(spec, prepared, planned.plan, planned.graph, b, None, Path("."), main)
    first = train_loop._resume(run, ckpt)
    ex = Executor(planned.plan, planned.graph, b)  # binds: keeps a restored critic
    metrics = [ex.run_step(k, data.step(k)).metrics for k in range(first, last)]
    out = {
        "first": first,
        "metrics": metrics,
        "policy": _full(b.trainer.model),
        "critic": _full(b.critic.model),
        "policy_adam": _adam(b.trainer),
        "critic_adam": _adam(b.critic),
        "versions": (b.trainer.counter.n, b.critic.counter.n),
        "reward_kl_coef": b.role_free.reward_kl_coef(),
    }
    if save_to is not None:
        out["saved"] = str(train_loop._save(run, save_to, last))
    return out


def _full(model) -> dict[str, torch.Tensor]:
    return {n: full(p.detach()).clone() for n, p in model.named_parameters()}


def _adam(owner) -> dict[str, dict[str, torch.Tensor]]:
    """Each trained parameter's AdamW state, gathered (a collective per sharded tensor)."""
    state = owner.optimizer.state
    return {
        n: {k: full(v).clone() for k, v in state[p].items()}
        for n, p in owner.model.named_parameters()  # the same order on every rank
        if p in state
    }


__all__ = ["resume_report"]
