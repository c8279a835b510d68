"""Scalars, text tables and hparams next to the traces, through torch's SummaryWriter.

Everything goes into the run folder that holds the `*.pt.trace.json` files, so TensorBoard
shows one run with its timeline (PyTorch Profiler tab), numbers (Scalars), tables (Text)
and knobs (HParams). torch is imported on first use: the planner and simulator import
`rollplex.trace` on machines where only the timeline model is needed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

Scalar = int | float | str | bool


def open_writer(run_dir: str | os.PathLike) -> SummaryWriter:
    """A SummaryWriter on `run_dir`; use it as a context manager so it is flushed and closed."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=os.fspath(run_dir))


def write_scalars(writer: SummaryWriter, values: Mapping[str, float], step: int = 0) -> None:
    """One scalar per tag, e.g. {"step_time_s": 1.9, "speedup_vs_serial": 1.07}."""
    for tag, value in values.items():
        writer.add_scalar(tag, float(value), global_step=step)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-style markdown table (TensorBoard's Text tab renders it)."""

    def cell(v: object) -> str:
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "---|" * len(headers))
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_text(writer: SummaryWriter, tag: str, markdown: str, step: int = 0) -> None:
    """Markdown text, e.g. `TimelineDiff.markdown()`."""
    writer.add_text(tag, markdown, global_step=step)


def write_table(
    writer: SummaryWriter,
    tag: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    step: int = 0,
) -> str:
    """Write a table as markdown text and return the markdown."""
    text = markdown_table(headers, rows)
    writer.add_text(tag, text, global_step=step)
    return text


def write_hparams(
    writer: SummaryWriter, hparams: Mapping[str, Scalar], metrics: Mapping[str, float]
) -> None:
    """Schedule knobs and their outcome for the HParams tab, in this run's own folder.

    SummaryWriter.add_hparams writes into a new timestamped sub-run unless given a run
    name; "." keeps it in the run folder beside the traces and scalars. It opens a second
    event file there, so call this last: a live TensorBoard stops reading the first file
    once a newer one exists.
    """
    clean = {k: v if isinstance(v, Scalar) else str(v) for k, v in hparams.items()}
    writer.add_hparams(clean, {k: float(v) for k, v in metrics.items()}, run_name=".")
