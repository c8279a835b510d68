"""Scalars, tables and hparams land in the run folder itself (read back with TensorBoard)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollplex.trace import (
    markdown_table,
    open_writer,
    write_hparams,
    write_scalars,
    write_table,
    write_text,
)

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is not installed",
)


def test_markdown_table() -> None:
    text = markdown_table(["op", "time (us)"], [["a|b", 1234.5678], ["c", 2]])
    assert text.splitlines() == [
        "| op | time (us) |",
        "|---|---|",
        "| a\\|b | 1235 |",
        "| c | 2 |",
    ]


def test_everything_lands_in_the_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with open_writer(run) as w:
        write_scalars(w, {"step_time_s": 1.5, "peak_bytes": 7 << 30}, step=0)
        write_scalars(w, {"step_time_s": 1.25}, step=1)
        table = write_table(w, "plan_vs_measured", ["op", "ratio"], [["decode", 1.1]])
        write_text(w, "notes", "**serial** baseline")
        write_hparams(
            w, {"schedule": "rollplex", "streams": 3, "piggyback": True}, {"speedup": 1.07}
        )
    assert [p for p in run.iterdir() if p.is_dir()] == []  # no timestamped sub-run
    acc = event_accumulator.EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("step_time_s")] == [(0, 1.5), (1, 1.25)]
    assert acc.Scalars("peak_bytes")[0].value == float(7 << 30)
    assert acc.Scalars("speedup")[0].value == pytest.approx(1.07)
    tensors = acc.Tags()["tensors"]
    assert {"plan_vs_measured/text_summary", "notes/text_summary"} <= set(tensors)
    text = acc.Tensors("plan_vs_measured/text_summary")[0].tensor_proto.string_val[0].decode()
    assert text == table
    hparams = acc.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(hparams)
