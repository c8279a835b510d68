"""What the roles hold when a run's backward starts, on CPU: every tensor storage Python can
reach, grouped by its owner (each role's model, the policy's float32 masters and AdamW
moments, the rest), beside what a bf16 policy's weights, masters and moments should take.

A GPU snapshot names the op that allocated a block, not who keeps it; this names the
keeper, on the tiny model with bf16 parameters as on a GPU (masters and all). It found the
reference model a kl_coef=0 run built and never read (stop 61,
bench/results/gpu_profile/memory_peak_qwen2_5_vl_3b_rollplex_every_row_h100_kl0.md):
  python bench/held_tensors.py algo.kl_coef=0          # [Hydra overrides of gpu_step's CPU run]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from rollplex.backends.torch.handles import OptimizerHandle
from rollplex.backends.torch.masters import own_masters

sys.path.insert(0, str(Path(__file__).parent))

MiB = 2**20
# gpu_step.py's video workload at the tiny model's scale, every row trained
CPU_RUN = [
    "model=tiny", "hardware=cpu", "data=synthetic_video", "data.image_size=56",
    "workload=video", "workload.frames=2", "workload.height=56", "workload.width=56",
    "workload.prompts_per_step=2", "workload.group_size=4", "workload.text_tokens=8",
    "workload.response_length.distribution=lognormal", "workload.response_length.mean=8",
    "workload.response_length.max=16", "train.max_new_tokens=16", "train.response_lengths=workload",
    "train.device=cpu", "train.checkpoint_every=0", "train.eval_every=0", "train.progress=false",
    "schedule=rollplex", "algo.skip_zero_advantage=false",
]  # fmt: skip


def _storages(tensors) -> dict[int, int]:
    out: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            st = t.untyped_storage()
            if st.data_ptr():
                out[st.data_ptr()] = st.nbytes()
    return out


def owners(dispatch) -> dict[str, dict[int, int]]:
    """Storages by who keeps them, first owner wins: the rollout aliases the policy."""
    trainer, critic, reference = dispatch.trainer, dispatch.critic, dispatch.reference
    named = {
        "policy weights": trainer.model.parameters(),
        "rollout weights": dispatch.rollout.model.parameters(),
        "reference weights": reference.model.parameters() if reference else (),
        "policy masters": trainer.master_tensors(),
        "AdamW moments": OptimizerHandle(trainer.optimizer).tensors(),
        "critic weights": critic.model.parameters() if critic else (),
        "critic masters and moments": (
            OptimizerHandle(critic.optimizer, own_masters(critic.masters)).tensors()
            if critic
            else ()
        ),
    }
    out, seen = {}, set()
    for name, tensors in named.items():
        out[name] = {k: n for k, n in _storages(tensors).items() if k not in seen}
        seen |= set(out[name])
    every = _storages(o for o in gc.get_objects() if isinstance(o, torch.Tensor))
    out["other tensors Python holds"] = {k: n for k, n in every.items() if k not in seen}
    return out


def main() -> None:
    from gpu_step import compose_spec

    import rollplex.models.io as io
    from rollplex.jobs import run_job
    from rollplex.runtime.dispatch import RoleDispatch

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="more Hydra overrides")
    args = ap.parse_args()
    io.default_dtype = lambda device: torch.bfloat16  # as on a GPU: bf16 weights, fp32 masters
    spec = compose_spec([*CPU_RUN, f"train.steps={args.steps}", *args.extra])
    run_op, backwards = RoleDispatch.run_op, [0]
    report: dict[str, dict[int, int]] = defaultdict(dict)

    def at_last_backward(self, op, inputs, chunk, carry):
        if op.kind == "backward":
            backwards[0] += 1
            if backwards[0] == args.steps:  # the last step's: AdamW's moments exist
                report.update(owners(self))
        return run_op(self, op, inputs, chunk, carry)

    RoleDispatch.run_op = at_last_backward
    with tempfile.TemporaryDirectory() as tmp:
        run_job(spec, Path(tmp) / "run")
    params = sum(report["policy weights"].values())
    print(f"overrides: {' '.join(args.extra) or '(none)'}")
    print("| held by | MiB | storages | x the policy's bf16 weights |")
    print("|---|---:|---:|---:|")
    for name, storages in report.items():
        total = sum(storages.values())
        print(f"| {name} | {total / MiB:.3f} | {len(storages)} | {total / params:.2f} |")


if __name__ == "__main__":
    main()
