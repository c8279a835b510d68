"""Weight sharing between FSDP2 training and vLLM TP rollout, as a grid (CPU, no torch).

    PYTHONPATH=$PWD python bench/weights_grid.py [model] > bench/results/weights_grid.md

Per (FSDP degree, rollout TP) on the same GPUs: the shared fraction of the rollout copy,
the rebuild buffer and the full rollout copy per GPU, the bytes re-synced per optimizer
step (trainable tensors), once with the aliasing layout and the best rank map
(`storage=aliasing rank_map=auto`, the default) and once with plain FSDP2 storage and
vLLM's contiguous ranks; then one GPU for every model size.
"""

from __future__ import annotations

import sys
import time

from rollplex.specs import MODEL_PRESETS
from rollplex.specs.weights import WeightsSpec
from rollplex.weights import build_sharing, tally

GIB = 1 << 30
FSDP = (8, 16, 32)
TP = (1, 2, 4, 8)


def cell(model: str, **fields) -> str:
    s = tally(build_sharing(MODEL_PRESETS[model], WeightsSpec(**fields))).summary()
    return (
        f"{s['shared_fraction']:.1%} / {s['rebuild_bytes_per_gpu'] / GIB:.2f} / "
        f"{s['full_copy_bytes_per_gpu'] / GIB:.2f} / {s['sync_bytes_per_step_per_gpu'] / GIB:.2f}"
    )


def grid(model: str, **fields) -> str:
    lines = ["| FSDP \\ rollout TP | " + " | ".join(f"TP {t}" for t in TP) + " |"]
    lines.append("|---|" + "---|" * len(TP))
    for d in FSDP:
        row = [cell(model, train_fsdp=d, rollout_tp=t, **fields) for t in TP]
        lines.append(f"| FSDP {d} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "qwen2_5_vl_32b"
    start = time.perf_counter()
    print(f"# Weight sharing grid: {model}, FSDP2 training vs vLLM TP rollout (bf16)\n")
    print(f"`PYTHONPATH=$PWD python bench/weights_grid.py {model}` (CPU, layout algebra only)\n")
    print(
        "Each cell: shared fraction of the rollout copy (all GPUs) / rebuild buffer per GPU "
        "(GiB, max) / full rollout copy per GPU (GiB, max) / re-synced per optimizer step "
        "per GPU (GiB, max; the frozen vision tower is rebuilt once). Training and rollout "
        "share the FSDP degree's GPUs (rollout replicas = FSDP / TP). The vision tower is "
        "TP-split where vLLM can split it (TP 1, 2, 4) and replicated at TP 8 (its MLP is "
        "3420 wide).\n"
    )
    print("## Aliasing layout, best rank map (the default)\n")
    print(grid(model) + "\n")
    print("## Plain FSDP2 storage, vLLM's contiguous ranks (baseline)\n")
    print(grid(model, storage="fsdp", rank_map="contiguous") + "\n")
    print("## One GPU (FSDP 1, rollout TP 1)\n")
    print("| model | shared | rebuild GiB | full copy GiB |\n|---|---|---|---|")
    for name in ("qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen2_5_vl_32b", "qwen2_5_vl_72b"):
        s = tally(build_sharing(MODEL_PRESETS[name], WeightsSpec())).summary()
        print(
            f"| {name} | {s['shared_fraction']:.1%} | {s['rebuild_bytes_per_gpu'] / GIB:.2f} "
            f"| {s['full_copy_bytes_per_gpu'] / GIB:.2f} |"
        )
    print(f"\n({time.perf_counter() - start:.1f} s for the whole file on one core.)")


if __name__ == "__main__":
    main()
