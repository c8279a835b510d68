"""What the distributed tests run inside each rank (`python -m tests.distributed.worker`,
under torchrun for N > 1). Rank 0 writes what it found to --out as a torch file; a check
that fails raises, so the process group exits non-zero.

    views  --steps K --out F [--sync gather|alias|share] [--tp T] [--kv-heads H] [--dtype D]
        K GRPO steps through the plan (serial schedule) with the fsdp trainer, then:
        the rollout's view of every parameter equals the gathered full parameter, bit for
        bit (rollout TP 1: the slice is the whole tensor), after each weight sync.
        With --sync share: share_checks.py (TP T rollout on the shards), one report per
        rank (F with suffix .rankN.pt).
    load   --ckpt DIR --out F
        restore a DCP checkpoint (saved by any number of ranks) and write the gathered full
        parameters and AdamW state.
    ppo    --steps K --out F [--micro-tokens N]
        K PPO steps with the fsdp trainer (ppo_checks.py); one report per rank (F with
        suffix .rankN.pt): the gathered policy and critic, the value loss, the critic's shards.
    ppo-resume  --steps K --stop S --out F
        PPO (the reward KL under the adaptive controller) straight to K, and to S,
        checkpointed and resumed to K (ppo_resume_checks.py); one report per rank, the
        checkpoint beside F.
    batch  JOB...
        each JOB (one quoted command line of the above) in turn, in one process group: a
        launch's start costs more than its checks (conftest.py CHECKS).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rollplex.backends.fsdp.shard import full, local
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.runtime.dcp_checkpoint import read_dcp_checkpoint, restore_dcp
from rollplex.runtime.dispatch import RoleDispatch
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ModelSpec,
)
from rollplex.specs.backend import BackendSpec
from rollplex.specs.fsdp import FsdpSpec
from rollplex.specs.schedule import ScheduleSpec

MODEL, WORKLOAD = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"]
# Weight decay moves every parameter at every step, learning signal or not.
ALGO = AlgoSpec(lr=1e-3, weight_decay=0.1)


def backend(
    sync: str = "gather", seed: int = 0, model: ModelSpec = MODEL, tp: int = 1, dtype=None
) -> RoleDispatch:
    fsdp = FsdpSpec(rollout_sync=sync, rollout_tp=tp, param_dtype=dtype)
    spec = BackendSpec(trainer="fsdp", fsdp=fsdp)
    return compose(StepConfig(model, ALGO, seed, 4), spec)


def rollout_view_check(b: RoleDispatch) -> int:
    """Every rollout parameter == the gathered full parameter, bit for bit; returns how
    many were checked."""
    mine = dict(b.rollout.model.named_parameters())
    n = 0
    for name, value in b.trainer.full_parameters():
        if not torch.equal(mine[name], value):
            raise AssertionError(f"rank {dist.get_rank()}: rollout {name} != gathered full")
        n += 1
    return n


def views(args) -> None:
    torch.use_deterministic_algorithms(True)
    if args.sync == "share":
        return share_views(args)
    b = backend(args.sync, tp=args.tp)
    planned = plan_step(MODEL, WORKLOAD, ALGO, HARDWARE_PRESETS["cpu"], ScheduleSpec(name="serial"))
    data = TaskData(MODEL, WORKLOAD, seed=0)
    ex = Executor(planned.plan, planned.graph, b)
    checked, moved, ptrs = 0, 0, {}
    before = {n: v.clone() for n, v in b.trainer.full_parameters()}
    for k in range(args.steps):
        ex.run_step(k, data.step(k))
        # The step ends with optimizer_step, then the graph's weight_sync: the rollout
        # already holds the new version, through the fsdp rollout's gather-and-copy (or alias).
        assert b.rollout.weights_version == f"policy@{k + 1}", b.rollout.weights_version
        checked += rollout_view_check(b)
        now = dict(b.trainer.full_parameters())
        moved += sum(not torch.equal(before[n], now[n]) for n in now)
        before = {n: v.clone() for n, v in now.items()}
        pairs = zip(
            b.rollout.model.named_parameters(), b.trainer.model.named_parameters(), strict=True
        )
        for (name, p), (_, q) in pairs:
            shared = p.data_ptr() == local(q).data_ptr()
            if args.sync == "alias":  # the rollout reads the trainer's storage itself
                assert shared, f"{name} is not aliased"
                assert ptrs.setdefault(name, p.data_ptr()) == p.data_ptr(), f"{name} moved"
            else:
                assert not shared, f"{name}: gather mode must copy"
    if dist.get_rank() == 0:
        report = {"checked": checked, "moved": moved, "steps": args.steps}
        torch.save({**report, "world": dist.get_world_size()}, args.out)


def load(args) -> None:
    state = json.loads((args.ckpt / "trainer_state.json").read_text())
    model = ModelSpec.model_validate(state["model"])  # the run's (its demo folder)
    b = backend(model=model)
    ckpt = read_dcp_checkpoint(args.ckpt, model, 0)
    restore_dcp(b.trainer, ckpt)
    params = {n: v.clone() for n, v in b.trainer.full_parameters()}
    optim = {}
    for p, st in b.trainer.optimizer.state.items():
        name = next(n for n, q in b.trainer.model.named_parameters() if q is p)
        optim[name] = {k: full(v).clone() for k, v in st.items() if torch.is_tensor(v)}
    if dist.get_rank() == 0:
        torch.save({"params": params, "optim": optim, "version": b.trainer.counter.n}, args.out)


def share_views(args) -> None:
    """`views --sync share`: share_checks.py's checks; each rank writes its own report."""
    from tests.distributed.share_checks import check_share

    model = MODEL.model_copy(update={"num_kv_heads": args.kv_heads or MODEL.num_kv_heads})
    b = backend("share", model=model, tp=args.tp, dtype=args.dtype)
    report = check_share(b, args.steps, model)
    torch.save(report, args.out.with_suffix(f".rank{dist.get_rank()}.pt"))


def ppo(args) -> None:
    from tests.distributed.ppo_checks import rank_report

    report = rank_report(args.steps, args.micro_tokens)
    torch.save(report, args.out.with_suffix(f".rank{dist.get_rank()}.pt"))


def ppo_resume(args) -> None:
    from tests.distributed.ppo_resume_checks import resume_report

    folder = args.out.with_name(f"{args.out.stem}-checkpoints")
    report = resume_report(args.steps, args.stop, folder)
    torch.save(report, args.out.with_suffix(f".rank{dist.get_rank()}.pt"))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["views", "load", "ppo", "ppo-resume"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--sync", default="gather")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--dtype", default=None, help="the trainer's compute dtype (FsdpSpec)")
    ap.add_argument("--ckpt", type=Path)
    ap.add_argument("--micro-tokens", type=int, default=None, help="ppo: train_micro_tokens")
    ap.add_argument("--stop", type=int, default=1, help="ppo-resume: the checkpoint's step")
    return ap


def main() -> None:
    argv = sys.argv[1:]
    # `batch JOB...`: each JOB one quoted command line, run in turn in this process group
    jobs = [shlex.split(j) for j in argv[1:]] if argv[:1] == ["batch"] else [argv]
    torch.set_num_threads(1)
    for job in jobs:
        args = parser().parse_args(job)
        torch.use_deterministic_algorithms(False)  # as a fresh process starts (views sets it)
        modes = {"views": views, "load": load, "ppo": ppo, "ppo-resume": ppo_resume}
        modes[args.mode](args)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
