"""Decode-like and prefix-like work side by side: serially, on two plain streams, and on
SM partitions (CUDA green contexts, rollplex/engine/green_contexts.py).

- decode-like: bandwidth-bound. One "step" is a chain of skinny bf16 GEMMs (`--rows` rows)
  over `--decode-gb` of distinct weights, captured as one CUDA graph and replayed `--steps`
  times: weights read once per step, like a decode step's weight reads;
- prefix-like: compute-bound. A chain of large bf16 GEMMs (`--prefix-tokens` rows) over 1
  GB of other weights, as many as take about as long as the decode work alone (measured).

Modes, each the median wall time of `--repeats` runs in this one process:
- `serial`: decode then prefix on one stream;
- `streams`: decode and prefix on two plain streams;
- `green d/p`: decode on a partition of d SMs, prefix on one of p SMs, for each decode share
  in `--splits`, with the decode graph `confined` (captured on its partition's stream) and
  `unconfined` (captured on a plain stream, replayed on the partition's stream: its
  kernels use the whole GPU); plus each side alone on its partition.

    python bench/gpu_green.py          # H200: about 1 min

Needs cuda-bindings (green contexts); without it the green rows say why they are missing.
FACTS.md measured 1.01x (two streams) and 1.01-1.07x (green splits) for a real decode
beside a vision tower and a prefill. Prints a table last and writes JSON to
$OUT/gpu_green.json (else bench/results/gpu_green/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from rollplex.engine.green_contexts import (
    GreenContexts,
    PartitionGraph,
    green_stream,
    make_green_streams,
)

HBM_TBS = {"H200": 4.8, "H100": 3.35}  # nominal HBM bandwidth, TB/s


class Work:
    def __init__(self, args: argparse.Namespace, dev: torch.device) -> None:
        h = args.hidden
        per = h * h * 2
        count = max(1, round(args.decode_gb * 1e9 / per))
        self.decode_bytes = count * per
        gen = torch.Generator(dev).manual_seed(0)
        scale = h**-0.5  # activations stay finite through the chain

        def weights(n: int) -> list[torch.Tensor]:
            return [
                torch.randn(h, h, device=dev, dtype=torch.bfloat16, generator=gen) * scale
                for _ in range(n)
            ]

        self.dw, self.pw = weights(count), weights(max(1, round(1e9 / per)))
        self.dx = [torch.randn(args.rows, h, device=dev, dtype=torch.bfloat16) for _ in "ab"]
        self.px = [torch.randn(args.prefix_tokens, h, device=dev, dtype=torch.bfloat16)]
        self.px.append(torch.empty_like(self.px[0]))
        self.steps, self.prefix_gemms = args.steps, 1

    def decode_step(self) -> None:
        a, b = self.dx
        for w in self.dw:
            torch.matmul(a, w, out=b)
            a, b = b, a

    def prefix(self) -> None:
        a, b = self.px
        for i in range(self.prefix_gemms):
            torch.matmul(a, self.pw[i % len(self.pw)], out=b)
            a, b = b, a

    def capture(self, stream: torch.cuda.Stream | None) -> torch.cuda.CUDAGraph:
        """One decode step as a graph, captured on `stream` (None: torch's side stream)."""
        warm = torch.cuda.Stream() if stream is None else stream
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            self.decode_step()  # cuBLAS workspaces of this stream, lazy inits
        torch.cuda.current_stream().wait_stream(warm)
        graph = PartitionGraph()
        graph.captured_on = None if stream is None else green_stream(stream)
        with torch.cuda.graph(graph, stream=stream):
            self.decode_step()
        return graph


def wall(fn: Callable[[], None], streams: list[torch.cuda.Stream], repeats: int) -> float:
    """Median seconds of `fn` (which issues work on `streams`), after one warm-up."""
    times = []
    for k in range(repeats + 1):
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        for s in streams:  # a device sync covers the primary context, not green ones
            s.synchronize()
        torch.cuda.synchronize()
        if k:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(
    work: Work,
    decode: tuple[torch.cuda.Stream, torch.cuda.CUDAGraph] | None,
    prefix: torch.cuda.Stream | None,
    repeats: int,
) -> float:
    def body() -> None:
        if decode is not None:
            with torch.cuda.stream(decode[0]):
                for _ in range(work.steps):
                    decode[1].replay()
        if prefix is not None:
            with torch.cuda.stream(prefix):
                work.prefix()

    used = [s for s in (None if decode is None else decode[0], prefix) if s is not None]
    return wall(body, used, repeats)


def serial(work: Work, graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, r: int) -> float:
    def body() -> None:
        with torch.cuda.stream(stream):
            for _ in range(work.steps):
                graph.replay()
            work.prefix()

    return wall(body, [stream], r)


def bench(args: argparse.Namespace) -> tuple[list[dict], dict]:
    dev = torch.device("cuda", torch.cuda.current_device())
    work = Work(args, dev)
    plain_a, plain_b = torch.cuda.Stream(), torch.cuda.Stream()
    free = work.capture(None)  # captured outside any partition
    decode_s = run(work, (plain_a, free), None, args.repeats)
    gemm_s = run(work, None, plain_b, args.repeats)  # one prefix GEMM
    work.prefix_gemms = max(1, round(decode_s / gemm_s))  # prefix alone ~ decode alone
    prefix_s = run(work, None, plain_b, args.repeats)
    step_s = decode_s / work.steps
    name = torch.cuda.get_device_name(dev)
    peak = next((v for k, v in HBM_TBS.items() if k in name), None)
    meta = {
        "decode_step_ms": step_s * 1e3,
        "decode_weight_gb": work.decode_bytes / 1e9,
        "decode_tbs": work.decode_bytes / step_s / 1e12,
        "decode_hbm_fraction": work.decode_bytes / step_s / 1e12 / peak if peak else None,
        "prefix_gemms": work.prefix_gemms,
        "prefix_tflops": 2
        * args.prefix_tokens
        * args.hidden**2
        * work.prefix_gemms
        / prefix_s
        / 1e12,
        "sms": torch.cuda.get_device_properties(dev).multi_processor_count,
    }
    base = serial(work, free, plain_a, args.repeats)
    rows = [
        {"mode": "serial", "time_s": base, "decode_alone_s": decode_s, "prefix_alone_s": prefix_s},
        {"mode": "streams", "time_s": run(work, (plain_a, free), plain_b, args.repeats)},
    ]
    for f in (float(x) for x in args.splits.split(",")):
        made = make_green_streams(dev, {"decode": f, "prefix": 1 - f})
        if isinstance(made, str):
            rows.append({"mode": f"green {f:.0%} decode", "skipped": made})
            print(f"green contexts not made: {made}", flush=True)
            break
        rows += green_rows(work, made, free, args.repeats)
        made.close()
    for r in rows:
        if "time_s" in r:
            r["speedup_vs_serial"] = base / r["time_s"]
        print(json.dumps(r), flush=True)
    return rows, meta


def green_rows(
    work: Work, made: GreenContexts, free: torch.cuda.CUDAGraph, repeats: int
) -> list[dict]:
    d, p = made.streams["decode"], made.streams["prefix"]
    split = f"green {d.sms}/{p.sms}"
    confined = work.capture(d.stream)
    out = []
    for label, graph in (("confined", confined), ("unconfined", free)):
        out.append({
            "mode": f"{split} {label}",
            "time_s": run(work, (d.stream, graph), p.stream, repeats),
            "decode_sms": d.sms,
            "prefix_sms": p.sms,
            "decode_alone_s": run(work, (d.stream, graph), None, repeats),
            "prefix_alone_s": run(work, None, p.stream, repeats) if label == "confined" else None,
        })  # fmt: skip
    d.take_notes()  # the unconfined replays were noted: here that is the point
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--decode-gb", type=float, default=8.0)
    p.add_argument("--rows", type=int, default=32, help="decode batch rows")
    p.add_argument("--steps", type=int, default=100, help="decode steps per run")
    p.add_argument("--prefix-tokens", type=int, default=4096)
    p.add_argument("--splits", default="0.375,0.5,0.625", help="decode's SM shares")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_green.py needs CUDA")
    rows, meta = bench(args)
    where = Path(os.environ.get("OUT") or "bench/results/gpu_green")
    where.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "command": "python bench/gpu_green.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "workload": vars(args) | meta,
        "results": rows,
    }
    (where / "gpu_green.json").write_text(json.dumps(record, indent=1))
    print(
        f"\ndecode step {meta['decode_step_ms']:.2f} ms over {meta['decode_weight_gb']:.1f} GB "
        f"({meta['decode_tbs']:.2f} TB/s"
        + (f", {meta['decode_hbm_fraction']:.0%} of HBM" if meta["decode_hbm_fraction"] else "")
        + f"); prefix {meta['prefix_gemms']} GEMMs at {meta['prefix_tflops']:.0f} TFLOP/s"
    )
    print("| mode | time (s) | speedup vs serial | decode alone (s) | prefix alone (s) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        if "time_s" not in r:
            print(f"| {r['mode']} | skipped: {r['skipped']} | | | |")
            continue
        alone = [r.get(k) for k in ("decode_alone_s", "prefix_alone_s")]
        cells = ["" if a is None else f"{a:.3f}" for a in alone]
        print(f"| {r['mode']} | {r['time_s']:.3f} | {r['speedup_vs_serial']:.3f}x | "
              f"{cells[0]} | {cells[1]} |")  # fmt: skip


if __name__ == "__main__":
    main()
