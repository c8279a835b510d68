"""Timelines (planned and measured) and their export to TensorBoard.

`Timeline` is the backend-neutral record; `write_profiler_traces` writes what the
torch-tb-profiler plugin shows, `scalars` the numbers, tables and hparams beside it,
`diff_timelines` compares plan and measurement, and `torch_trace` names a torch.profiler
trace's memory by plan step.
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
