"""Scalars, text tables and hparams next to the traces, through tensorboard's own writer.

Written into the folder of the `*.pt.trace.json` files, so TensorBoard shows one run. Uses
tensorboard's EventFileWriter rather than torch's SummaryWriter (importing torch costs
2-4 s, and planning jobs need none of it); tags and payloads match SummaryWriter's.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Mapping, Sequence
from typing import Self

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

Scalar = int | float | str | bool


class EventWriter:
    """The subset of SummaryWriter that rollplex uses: scalars, text, hparams."""

    def __init__(self, log_dir: str | os.PathLike) -> None:
        self.log_dir = os.fspath(log_dir)
        self._file = EventFileWriter(self.log_dir)

    def _write(self, summary: Summary, step: int = 0) -> None:
        self._file.add_event(Event(summary=summary, wall_time=time.time(), step=step))

    def add_scalar(self, tag: str, value: float, global_step: int = 0) -> None:
        self._write(Summary(value=[Summary.Value(tag=tag, simple_value=value)]), global_step)

    def add_text(self, tag: str, text: str, global_step: int = 0) -> None:
        self._write(text_pb(f"{tag}/text_summary", text), global_step)

    def add_image_png(self, tag: str, png: bytes, global_step: int = 0) -> None:
        """An encoded PNG for the Images tab (what SummaryWriter.add_image writes)."""
        from PIL import Image

        with Image.open(io.BytesIO(png)) as im:
            width, height = im.size
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=png)
        self._write(Summary(value=[Summary.Value(tag=tag, image=image)]), global_step)

    def add_hparams(self, hparams: Mapping[str, Scalar], metrics: Mapping[str, float]) -> None:
        """The HParams tab's experiment and session records, and each metric as a scalar."""
        config = hp.hparams_config_pb(
            hparams=[hp.HParam(k) for k in hparams],
            metrics=[hp.Metric(k) for k in metrics],
        )
        self._write(config)
        self._write(hp.hparams_pb(dict(hparams)))
        for tag, value in metrics.items():
            self.add_scalar(tag, value)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_writer(run_dir: str | os.PathLike) -> EventWriter:
    """An event writer on `run_dir`; use it as a context manager so it is flushed and closed."""
    return EventWriter(run_dir)


def write_scalars(writer: EventWriter, values: Mapping[str, float], step: int = 0) -> None:
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


def write_text(writer: EventWriter, tag: str, markdown: str, step: int = 0) -> None:
    """Markdown text, e.g. `TimelineDiff.markdown()`."""
    writer.add_text(tag, markdown, global_step=step)


def write_image(writer: EventWriter, tag: str, png: bytes, step: int = 0) -> None:
    """A PNG (e.g. `gantt.comparison_png`) into the Images tab."""
    writer.add_image_png(tag, png, global_step=step)


def write_table(
    writer: EventWriter,
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
    writer: EventWriter, hparams: Mapping[str, Scalar], metrics: Mapping[str, float]
) -> None:
    """Schedule knobs and their outcome for the HParams tab, in this run's own folder (no
    timestamped sub-run, unlike SummaryWriter.add_hparams without a run name)."""
    clean = {k: v if isinstance(v, Scalar) else str(v) for k, v in hparams.items()}
    writer.add_hparams(clean, {k: float(v) for k, v in metrics.items()})
