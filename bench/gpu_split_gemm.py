"""The decode step's narrow projections (q/k/v, o, down) at its few rows: cuBLAS against
skinny.py's one-pass kernel and its split-reduction partials, each over its own weights.

Unlike gpu_skinny_gemm.py (one weight called 20 times, so the 7B q/k/v and o weights sit in
the 50 MB L2), every call here reads a different copy of the weight, cycling over enough
copies to exceed L2 several times, as a decode step reads each layer's weights once. The
split variant's float32 partials are timed alone (`partials`: in the engine a compiled
layer sums them inside the norm or rotary kernel that reads the output anyway) and with
their sum as a kernel of its own (`split+sum`: the cost if nothing fuses it).

    python bench/gpu_split_gemm.py     # one H200, ~2 min (Triton tunes each shape)

Prints a table last; JSON to $OUT/gpu_split_gemm.json (else bench/results/gpu_decode/).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from cuda_timing import graph_ms  # bench/ is on sys.path as the script's folder
from gpu_skinny_gemm import sweep, write_rows

from rollplex.engine.skinny import skinny_linear, skinny_partials, split_linear
from rollplex.specs import HARDWARE_PRESETS

L2_BYTES = 50 * 2**20


def bench_shape(model: str, proj: str, n: int, k: int, bias: bool, rows: int, splits, gbps):
    gen = torch.Generator(device="cuda").manual_seed(0)
    copies = max(4, -(-4 * L2_BYTES // (n * k * 2)))  # four L2s of weights per cycle
    ws = [torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02
          for _ in range(copies)]  # fmt: skip
    b = torch.randn(n, device="cuda", generator=gen, dtype=torch.bfloat16) if bias else None
    x = torch.randn(rows, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    ref = x.float() @ ws[0].float().T + (b.float() if b is not None else 0)
    scale = ref.abs().max().item()
    blas_err = (F.linear(x, ws[0], b).float() - ref).abs().max().item() / scale

    def over_copies(call):
        return lambda: [call(w) for w in ws]

    def per_call_us(call) -> float:
        return graph_ms(over_copies(call), calls=5) * 1e3 / copies

    variants = {
        "cublas": lambda w: F.linear(x, w, b),
        "skinny": lambda w: skinny_linear(x, w, b),
    }
    for s in splits:
        variants[f"partials{s}"] = lambda w, s=s: skinny_partials(x, w, s)
    entry = {"model": model, "proj": proj, "rows": rows, "n": n, "k": k, "copies": copies,
             "cublas_rel_err": blas_err}  # fmt: skip
    for name, call in variants.items():
        if name.startswith("partials"):
            s = int(name.removeprefix("partials"))
            err = (split_linear(x, ws[0], b, s).float() - ref).abs().max().item() / scale
            if err > 2 * blas_err + 1e-3:
                raise AssertionError(f"{proj} splits={s}: error {err:.2e} vs cuBLAS {blas_err:.2e}")
        us = per_call_us(call)
        entry[f"{name}_us"] = us
        entry[f"{name}_hbm_share"] = n * k * 2 / (us * 1e-6) / (gbps * 1e9)
    best = min(splits, key=lambda s: entry[f"partials{s}_us"])
    summed = torch.compile(lambda w: split_linear(x, w, b, best), dynamic=False)
    entry["best_splits"] = best
    entry["split+sum_us"] = per_call_us(summed)
    return entry


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="qwen2_5_vl_7b,qwen2_5_vl_3b")
    p.add_argument("--rows", default="8,32,64")
    p.add_argument("--splits", default="2,4,8")
    p.add_argument("--projections", default="qkv,o,down")
    args = p.parse_args()
    gbps = HARDWARE_PRESETS["h200"].hbm_bandwidth_gbps
    splits = [int(s) for s in args.splits.split(",")]
    bench = lambda *shape: bench_shape(*shape, splits, gbps)  # noqa: E731
    out = sweep(args.models, args.rows, bench, args.projections)
    write_rows("gpu_split_gemm", out)
    keys = ["cublas", "skinny", *(f"partials{s}" for s in splits)]
    print(f"\n{'model':14} {'proj':5} {'rows':>4} " + " ".join(f"{k:>14}" for k in keys)
          + f" {'split+sum':>10}")  # fmt: skip
    for e in out:
        if "error" in e:
            print(f"{e['model']:14} {e['proj']:5} {e['rows']:>4} ERROR {e['error'][:80]}")
            continue
        cells = [f"{e[f'{k}_us']:6.1f} ({e[f'{k}_hbm_share']:4.0%})" for k in keys]
        print(f"{e['model']:14} {e['proj']:5} {e['rows']:>4} " + " ".join(f"{c:>14}" for c in cells)
              + f" {e['split+sum_us']:10.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
