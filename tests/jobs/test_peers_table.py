"""bench/peers/table.py: each peer run over the rollplex run beside it in run order, as the
peers' one-GPU session alternates them (bench/results/peers/h100_3b_easyvqa)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "peers"))
import table


def _row(framework: str, schedule: str, step: float | None, error: str | None = None) -> dict:
    return {
        "framework": framework,
        "schedule": schedule,
        "shape": "qwen2_5_vl_3b",
        "workload": "easyvqa",
        "device_name": "NVIDIA H100 80GB HBM3",
        "step_time_s": step,
        "tokens_per_s": 262144 / step if step else None,
        "peak_bytes": 2**30,
        "peak_device_bytes": None,
        "phases": {},
        "error": error,
    }


def _write(folder: Path, rows: dict[str, dict]) -> None:
    for name, row in rows.items():
        (folder / f"{name}.json").write_text(json.dumps(row))


def _line(md: str, schedule: str) -> list[str]:
    line = next(x for x in md.splitlines() if f"| {schedule} |" in x)
    return [c.strip() for c in line.strip("|").split("|")]


def test_each_peer_run_is_paired_with_its_neighbouring_rollplex_run(tmp_path, monkeypatch):
    _write(
        tmp_path,
        {
            "00-rollplex-a": _row("rollplex", "rollplex", 2.0),
            "01-rollplex-b": _row("rollplex", "rollplex", 4.0),
            "02-trl-a": _row("trl", "vllm", 8.0),  # beside 01: 2.0
            "03-trl-b": _row("trl", "vllm", 6.0),  # beside 04: 2.0
            "04-rollplex-c": _row("rollplex", "rollplex", 3.0),
            "05-trl-c": _row("trl", "generate", 9.0),  # 04 and 06 tie: the earlier, 3.0
            "06-rollplex-d": _row("rollplex", "rollplex", 4.5),
            "07-trl-d": _row("trl", "vllm", None, error="ValueError: broke"),
        },
    )
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["table.py", "--rows", str(tmp_path), "--out", str(out)])
    table.main()
    md = (out / "peers.md").read_text()
    vllm = _line(md, "vllm")
    assert vllm[2] == "8.000, 6.000"  # the errored run has no step time
    assert vllm[6] == "2.00x +- 0.00"  # round by round (k-th with k-th): 2.75 +- 1.25
    assert vllm[8] == "ValueError: broke"
    assert _line(md, "generate")[6] == "3.00x (one run)"
    assert _line(md, "rollplex")[6] == "1"
    saved = json.loads((out / "peers.json").read_text())["rows"]
    assert [r["order"] for r in saved] == list(range(8))


@pytest.mark.parametrize("base", [[], [_row("rollplex", "rollplex", None, error="OOM")]])
def test_no_ratio_without_a_rollplex_run_that_ran(base):
    peer = [{**_row("trl", "vllm", 5.0), "order": 1}]
    assert table.ratio(peer, [{**b, "order": 0} for b in base]) == "-"
