"""Timelines (planned and measured) and their export to TensorBoard.

`Timeline` is the backend-neutral record the planner and runtime produce;
`write_profiler_traces` turns it into files the torch-tb-profiler plugin shows; `scalars`
adds numbers, tables and hparams to the same run; `diff_timelines` compares plan and
measurement; `torch_trace.attribute_to_steps` makes a torch.profiler trace of plan steps
name its memory by plan step (`runtime/profile.py` exports it beside the planned one).
"""

from __future__ import annotations

from rollplex.trace.diff import DiffRow, TimelineDiff, diff_timelines
from rollplex.trace.profiler_trace import build_profiler_trace, write_profiler_traces
from rollplex.trace.scalars import (
    markdown_table,
    open_writer,
    write_hparams,
    write_image,
    write_scalars,
    write_table,
    write_text,
)
from rollplex.trace.timeline import Mark, MemoryEvent, Span, Timeline

__all__ = [
    "DiffRow",
    "Mark",
    "MemoryEvent",
    "Span",
    "Timeline",
    "TimelineDiff",
    "build_profiler_trace",
    "diff_timelines",
    "markdown_table",
    "open_writer",
    "write_hparams",
    "write_image",
    "write_profiler_traces",
    "write_scalars",
    "write_table",
    "write_text",
]
