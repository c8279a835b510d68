"""Timing a short CUDA call: a graph of `calls` calls, replayed `repeats` times."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def graph_ms(fn: Callable[[], object], calls: int = 20, repeats: int = 5, warmup: int = 3) -> float:
    """Median milliseconds per call of `fn`: warmed up eagerly on a side stream (compilation,
    lazy inits), captured `calls` times in one CUDA graph, replayed once untimed, then
    `repeats` timed replays (launch overhead amortised, as the decode engine's graphs do)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)
