"""A decode step captured as a CUDA graph: warmed up first, captured on the SM partition's
stream when there is one, the workspace left as it was, and taken again once when CUDA
invalidated the capture."""

from __future__ import annotations

import logging

import torch

from rollplex.engine.green_contexts import PartitionGraph, green_stream
from rollplex.engine.step import DecodeStep
from rollplex.engine.workspace import Workspace
from rollplex.planner.gc_paused import cyclic_gc_paused

log = logging.getLogger(__name__)


class StepGraphs:
    """The captures of one engine: the memory pool its graphs share, and how many captures
    CUDA invalidated and were taken again."""

    __slots__ = ("device", "pool", "retries", "warmup_stream")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = None  # one pool for every graph of the engine, made at the first capture
        self.retries = 0
        # One side stream for every warm-up: cuBLAS keeps a workspace for each stream a GEMM
        # ran on until the job ends (jobs/devices.py), so a stream per capture costs one each.
        self.warmup_stream: torch.cuda.Stream | None = None

    def release(self) -> None:
        self.pool = None

    def capture(self, ws: Workspace, forward: DecodeStep, kv_len: int) -> torch.cuda.CUDAGraph:
        """`capture_once`, tried again once when CUDA invalidated the capture. An H200 run
        saw that intermittently at 64 and 256 rows ("operation failed due to a previous
        error during capture", bench/results/gpu_decode/fusion.md) with the step's kernels
        the same as in the warm-up just before; the process went on capturing other graphs
        fine, so one more warm-up and capture recovers. The retry is logged and counted in
        `retries`; a second failure raises."""
        try:
            return self.capture_once(ws, forward, kv_len)
        except RuntimeError as err:  # torch.AcceleratorError is a RuntimeError
            if "capture" not in str(err):
                raise
            log.warning(
                "decode graph capture at %d rows, kv_len %d was invalidated (%s); warming up "
                "and capturing again",
                ws.shape.rows,
                kv_len,
                str(err).splitlines()[0],
            )
            self.retries += 1
            torch.cuda.synchronize(self.device)
            return self.capture_once(ws, forward, kv_len)

    def capture_once(self, ws: Workspace, forward: DecodeStep, kv_len: int) -> torch.cuda.CUDAGraph:
        """Warm up and capture `ws.body` at `kv_len`, leaving the workspace's state as it
        was (also when the capture fails). The warm-up runs the current step for real; what
        it accumulates is restored after, and what it overwrites (this step's K/V slots,
        mask slot and output column) the replay that follows writes again with the same
        values. Python's cyclic collector is off during the capture: a collection there
        may free CUDA objects of earlier graphs or streams mid-capture."""
        mutable = (ws.token, ws.position, ws.step, ws.done, ws.lengths)
        saved = [t.clone() for t in mutable]
        try:
            if self.warmup_stream is None:
                self.warmup_stream = torch.cuda.Stream(self.device)
            stream = self.warmup_stream
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                ws.body(forward, kv_len)  # warm-up: lazy inits and workspace allocations
            torch.cuda.current_stream().wait_stream(stream)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            # On an SM partition's (green context's) stream, capture there: only a graph
            # captured on it stays on its SMs. The graph notes a replay on a partition it was
            # not captured on (green_contexts.py), which the executor reports.
            green = green_stream()
            graph = PartitionGraph()
            graph.captured_on = green
            with (
                cyclic_gc_paused(),
                torch.cuda.graph(
                    graph, pool=self.pool, stream=None if green is None else green.stream
                ),
            ):
                ws.body(forward, kv_len)
        finally:
            for t, s in zip(mutable, saved, strict=True):
                t.copy_(s)
        return graph
