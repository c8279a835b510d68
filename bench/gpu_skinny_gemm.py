"""A decode step's projections at its few rows: cuBLAS vs cuBLASLt vs the engine's Triton
weight-streaming kernels (rollplex/engine/skinny.py), side by side.

For the 3B and 7B shapes' q/k/v (stacked), o, gate+up (+SiLU), down and LM-head weights at
8-64 rows, times one call (CUDA graph of 20 calls, median of 5 replays) and reports the
weight bytes streamed per second against the H200's HBM bandwidth. gate+up is timed as the
compiled MLP input (two cuBLAS GEMMs and one fused SiLU-multiply) against one Triton kernel.
Checks each Triton result against float32 math (and the cuBLAS bf16 result) first.

    python bench/gpu_skinny_gemm.py          # one H200, ~1-2 min (Triton tunes each shape)

Prints a table last; JSON to $OUT/gpu_skinny_gemm.json (else bench/results/gpu_decode/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda_timing import graph_ms  # bench/ is on sys.path as the script's folder

from rollplex.engine.skinny import skinny_gate_up, skinny_linear
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS


def shapes(name: str) -> dict[str, tuple[int, int, bool]]:
    """Projection name -> (N, K, has bias) of one decoder layer, plus the LM head."""
    s = MODEL_PRESETS[name]
    kv = s.num_kv_heads * s.hidden_size // s.num_heads
    return {
        "qkv": (s.hidden_size + 2 * kv, s.hidden_size, True),
        "o": (s.hidden_size, s.hidden_size, False),
        "gate_up": (s.intermediate_size, s.hidden_size, False),
        "down": (s.hidden_size, s.intermediate_size, False),
        "lm_head": (s.vocab_size, s.hidden_size, False),
    }


def blas_ms(fn, library: str) -> float:
    torch.backends.cuda.preferred_blas_library(library)
    try:
        return graph_ms(fn)
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")


def check(name: str, got: torch.Tensor, ref32: torch.Tensor, blas: torch.Tensor) -> dict:
    scale = ref32.abs().max().item()
    err = (got.float() - ref32).abs().max().item() / scale
    blas_err = (blas.float() - ref32).abs().max().item() / scale
    if err > 4 * blas_err + 1e-2:
        raise AssertionError(f"{name}: Triton error {err:.2e} vs cuBLAS {blas_err:.2e}")
    return {"rel_err": err, "cublas_rel_err": blas_err}


def bench_shape(model: str, proj: str, n: int, k: int, bias: bool, rows: int, gbps: float):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02

    x = randn(rows, k) * 50
    if proj == "gate_up":
        wg, wu = randn(n, k), randn(n, k)

        @torch.compile(dynamic=False)
        def mlp_in(x):
            return F.silu(F.linear(x, wg)) * F.linear(x, wu)

        ref = F.silu(x.float() @ wg.float().T) * (x.float() @ wu.float().T)
        entry = check(proj, skinny_gate_up(x, wg, wu), ref, mlp_in(x))
        weight_bytes = 2 * n * k * 2
        base = {"cublas": lambda: mlp_in(x)}
        triton_fn = lambda: skinny_gate_up(x, wg, wu)  # noqa: E731
    else:
        w = randn(n, k)
        b = randn(n) if bias else None
        ref = x.float() @ w.float().T + (b.float() if b is not None else 0)
        entry = check(proj, skinny_linear(x, w, b), ref, F.linear(x, w, b))
        weight_bytes = n * k * 2
        base = {"cublas": lambda: F.linear(x, w, b)}
        triton_fn = lambda: skinny_linear(x, w, b)  # noqa: E731
    times = {"cublas": blas_ms(base["cublas"], "cublas")}
    if proj != "gate_up":
        times["cublaslt"] = blas_ms(base["cublas"], "cublaslt")
    times["triton"] = graph_ms(triton_fn)
    entry |= {"model": model, "proj": proj, "rows": rows, "n": n, "k": k}
    for key, ms in times.items():
        entry[f"{key}_us"] = ms * 1e3
        entry[f"{key}_hbm_share"] = weight_bytes / (ms * 1e-3) / (gbps * 1e9)
    return entry


def sweep(models: str, rows: str, bench, projections: str | None = None) -> list[dict]:
    """`bench(model, proj, n, k, bias, rows)` over every model x projection x row count,
    printed as it goes; a failing shape is recorded and does not lose the others."""
    out = []
    for model in models.split(","):
        for proj, (n, k, bias) in shapes(model).items():
            if projections is not None and proj not in projections.split(","):
                continue
            for r in (int(r) for r in rows.split(",")):
                try:
                    out.append(bench(model, proj, n, k, bias, r))
                except Exception as e:
                    out.append({"model": model, "proj": proj, "rows": r, "error": repr(e)})
                print(json.dumps(out[-1]), flush=True)
    return out


def write_rows(script: str, out: list[dict]) -> None:
    """The rows as $OUT/<script>.json (else bench/results/gpu_decode/), with the date, the
    device and the command."""
    dest = Path(os.environ.get("OUT", "bench/results/gpu_decode")) / f"{script}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": f"python bench/{script}.py " + " ".join(sys.argv[1:]),
    }
    dest.write_text(json.dumps({**meta, "rows": out}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="qwen2_5_vl_7b,qwen2_5_vl_3b")
    p.add_argument("--rows", default="8,16,32,64")
    args = p.parse_args()
    gbps = HARDWARE_PRESETS["h200"].hbm_bandwidth_gbps
    out = sweep(args.models, args.rows, lambda *shape: bench_shape(*shape, gbps))
    write_rows("gpu_skinny_gemm", out)
    print(f"\n{'model':14} {'proj':8} {'rows':>4} {'cuBLAS us (HBM)':>17} "
          f"{'cuBLASLt':>17} {'Triton':>17} {'rel err':>8}")  # fmt: skip
    for e in out:
        if "error" in e:
            print(f"{e['model']:14} {e['proj']:8} {e['rows']:>4} ERROR {e['error'][:60]}")
            continue
        cells = [
            f"{e[f'{key}_us']:8.1f} ({e[f'{key}_hbm_share']:4.0%})" if f"{key}_us" in e else "-"
            for key in ("cublas", "cublaslt", "triton")
        ]
        print(f"{e['model']:14} {e['proj']:8} {e['rows']:>4} "
              + " ".join(f"{c:>17}" for c in cells) + f" {e['rel_err']:8.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
