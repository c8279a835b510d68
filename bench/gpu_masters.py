"""The single-process torch trainer's optimizer step on a bf16 model, with float32 masters
(rollplex/backends/torch/masters.py), against the planner's pricing and plain bf16 AdamW.

Random bf16 weights at `--shape` on one device; backward's output is stood in for by random
bf16 gradients on the trained parameters (so activations do not blur the bytes). Measures
bytes a trained parameter held (allocator deltas beyond the weights) at rest, with the
gradients and at the step's peak, against the planner's 2 (weights) + 4 (grads) + 12
(`policy.adam`: master + 2 moments); the step's median time against plain AdamW over the
bf16 parameters; and, on one step at `--lr`, how far the masters moved (in units of lr) and
how many bf16 weights changed with masters and with plain bf16 AdamW's first step.

    python bench/gpu_masters.py --out bench/results/gpu_masters          # one H200, ~1-2 min
    python bench/gpu_masters.py --device cpu --shape tiny --out /tmp/m   # anywhere

Writes masters.json / masters.md under --out and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from rollplex.backends.torch.handles import GradsHandle
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.specs import MODEL_PRESETS, AlgoSpec

BF16 = torch.bfloat16
PLANNED = {"weights": 2, "grads": 4, "adam": 12}  # graph/builder.py: bf16, float32, (n, 3) f32


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _grads(params, seed: int | None = None) -> None:
    if seed is not None:
        torch.manual_seed(seed)
    for p in params:  # what backward leaves: bf16 gradients, accumulated in .grad
        p.grad = torch.randn_like(p)


def _held(trainer: TorchTrainer, n: int) -> float:
    """Bytes a trained parameter holds besides its weights, counted tensor by tensor."""
    t = [*trainer.master_tensors(), *(p.grad for p in trainer.params if p.grad is not None)]
    t += [v for st in trainer.optimizer.state.values() for v in st.values() if v.dim()]
    return sum(x.numel() * x.element_size() for x in t) / n


def _timed_steps(step, params, device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _grads(params)
        _sync(device)
        t = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])  # the first allocates the moments


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="bench/results/gpu_masters")
    a = ap.parse_args()
    device, spec = torch.device(a.device), MODEL_PRESETS[a.shape]
    with device:
        model = build_model(spec, seed=0, dtype=BF16)
    weights = _allocated(device)
    trainer = TorchTrainer(model, spec, AlgoSpec(lr=a.lr))
    n = sum(p.numel() for p in trainer.params)
    row: dict = {"shape": a.shape, "device": str(device), "trained_params": n, "lr": a.lr}
    row["masters_bytes_per_param"] = (_allocated(device) - weights) / n

    # `--steps` steps at lr of one constant gradient, on a few tensors kept aside: the
    # masters' move and the bf16 weights changed; plain bf16 AdamW moves a weight by
    # round(w - lr * g / (|g| + eps)) in bf16 each step, so one step shows all it ever moves
    probe = list(range(min(4, len(trainer.params))))
    _grads(trainer.params, seed=0)
    w0 = [trainer.params[i].detach().clone() for i in probe]
    m0 = [trainer.masters.tensors[i].clone() for i in probe]
    g0 = [trainer.params[i].grad.clone() for i in probe]
    for _ in range(a.steps):
        _grads(trainer.params, seed=0)
        trainer.optimizer_step(GradsHandle(trainer.params))
    moved = torch.cat(
        [(m0[k] - trainer.masters.tensors[i]).abs().flatten() for k, i in enumerate(probe)]
    )
    row["probe_steps"] = a.steps
    row["master_move_median_over_lr"] = float(moved.median() / a.lr)
    total = sum(w.numel() for w in w0)
    ours = sum(int((trainer.params[i].detach() != w0[k]).sum()) for k, i in enumerate(probe))
    # plain AdamW's first bf16 step: round(w - lr * g / (|g| + eps)) computed in bf16
    plain = sum(
        int(((w - (a.lr * g / (g.abs() + 1e-8))).to(BF16) != w).sum())
        for w, g in zip(w0, g0, strict=True)
    )
    row["weights_changed_masters"] = ours / total
    row["weights_changed_plain_bf16"] = plain / total
    del w0, m0, g0, moved

    _grads(trainer.params)
    row["with_grads_bytes_per_param"] = (_allocated(device) - weights) / n
    row["with_grads_counted_bytes_per_param"] = _held(trainer, n)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer.optimizer_step(GradsHandle(trainer.params))
    if device.type == "cuda":
        row["step_peak_bytes_per_param"] = (torch.cuda.max_memory_allocated(device) - weights) / n
    row["at_rest_bytes_per_param"] = (_allocated(device) - weights) / n
    row["at_rest_counted_bytes_per_param"] = _held(trainer, n)
    row["step_s_masters"] = _timed_steps(
        lambda: trainer.optimizer_step(GradsHandle(trainer.params)),
        trainer.params,
        device,
        a.repeats,
    )
    plain_opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr)
    params = plain_opt.param_groups[0]["params"]
    row["step_s_plain_bf16"] = _timed_steps(plain_opt.step, params, device, a.repeats)
    # comparable with the rows above: beyond the weights (grads 4 + policy.adam 12)
    row["planned_beyond_weights_bytes_per_param"] = sum(PLANNED.values()) - PLANNED["weights"]
    row["when"] = datetime.now(UTC).isoformat(timespec="seconds")

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "masters.json").write_text(json.dumps(row, indent=1) + "\n")
    lines = [
        f"`python bench/gpu_masters.py --device {a.device} --shape {a.shape} --lr {a.lr}`",
        "",
        "| quantity | value |",
        "|---|---|",
        *(
            f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
            for k, v in row.items()
        ),
        "",
        "Bytes a trained parameter holds beyond its bf16 weights (2 B): masters 4 + moments 8 at",
        "rest (12), + bf16 grads 2 after backward (14), float32 master grads 4 in the step",
        "(16); planned: grads 4 (float32) + policy.adam 12 = 16 beyond the weights. Plain bf16",
        "AdamW held grads 2 + moments 4 = 6. Allocator rows are 0 on CPU (no allocator stats).",
    ]
    (out / "masters.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
