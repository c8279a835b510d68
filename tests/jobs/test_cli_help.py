"""`rollplex --help` and `rollplex <job> --help`: the jobs, the config groups and their
options from conf/, and every field a job reads with its value and its spec description."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollplex.cli import JOBS, _conf_dir
from rollplex.jobs.cli_help import SECTIONS
from rollplex.jobs.overrides import groups
from rollplex.specs.run import RunSpec
from tests.jobs.cli_run import refusal_line, rollplex_here

GROUPS = groups(_conf_dir())


def test_general_help_lists_jobs_groups_and_options(tmp_path: Path, monkeypatch, capsys):
    r = rollplex_here(tmp_path, monkeypatch, capsys, "--help")
    assert r.returncode == 0
    assert all(f"  {job} " in r.stdout for job in JOBS)
    for group, options in GROUPS.items():
        (line,) = [ln for ln in r.stdout.splitlines() if ln.split()[:1] == [group]]
        assert line.split(None, 1)[1].split(", ") == options
    assert "examples:" in r.stdout
    assert not (tmp_path / "outputs").exists()


def test_bare_rollplex_prints_usage_and_exits_2(tmp_path: Path, monkeypatch, capsys):
    r = rollplex_here(tmp_path, monkeypatch, capsys)
    assert r.returncode == 2 and "jobs:" in r.stdout


def _fields(spec, prefix: str) -> list[tuple[str, str]]:
    """(key, description) of every leaf field under `spec`."""
    from rollplex.jobs.cli_help import _spec_type

    out = []
    for name, info in spec.model_fields.items():
        sub = _spec_type(info.annotation)
        if sub is not None and not str(info.annotation).startswith("tuple"):
            out += _fields(sub, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", info.description or ""))
    return out


@pytest.mark.parametrize("job", JOBS)
def test_job_help_shows_every_field_it_reads(tmp_path: Path, monkeypatch, capsys, job: str):
    r = rollplex_here(tmp_path, monkeypatch, capsys, job, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # descriptions are wrapped
    for section in SECTIONS[job]:
        info = RunSpec.model_fields[section]
        from rollplex.jobs.cli_help import _spec_type

        spec = _spec_type(info.annotation)
        fields = _fields(spec, f"{section}.") if spec else [(section, info.description)]
        for key, description in fields:
            assert f"  {key} = " in r.stdout, key
            assert " ".join(description.split()) in text, key
    others = {s for j in SECTIONS for s in SECTIONS[j]} - set(SECTIONS[job])
    # a field line (two spaces in; a description, six in, may name another section's key)
    assert not any(re.search(rf"^  {s}\.", r.stdout, re.M) for s in others)


def test_job_help_follows_the_overrides(tmp_path: Path, monkeypatch, capsys) -> None:
    r = rollplex_here(
        tmp_path, monkeypatch, capsys, "train", "backend=vllm", "train.steps=7", "--help", "train"
    )
    assert r.returncode == 0
    assert "  train.steps = 7" in r.stdout and "backend    default, fsdp, [vllm]" in r.stdout
    assert "  model." not in r.stdout  # one section asked for


def test_job_help_refuses_a_bad_override_or_section(tmp_path: Path, monkeypatch, capsys):
    line = refusal_line(rollplex_here(tmp_path, monkeypatch, capsys, "plan", "model=x", "-h"))
    assert "model 'x'" in line
    line = refusal_line(rollplex_here(tmp_path, monkeypatch, capsys, "plan", "--help", "nope"))
    assert "'nope'" in line and "schedule" in line


@pytest.mark.parametrize(
    "args", [("plan",), ("plan", "-m", "schedule=serial,disaggregated,rollplex")]
)
def test_bare_plan_fits_its_default_hardware(tmp_path: Path, monkeypatch, capsys, args):
    """`rollplex plan` with no override (and its sweep over the schedules) plans within the
    default hardware's budget, and says where it wrote."""
    import json

    r = rollplex_here(tmp_path, monkeypatch, capsys, *args)
    assert r.returncode == 0, r.stderr
    summaries = list(tmp_path.glob("*/plan/*/summary.json")) + list(
        tmp_path.glob("multirun/plan/*/*/summary.json")
    )
    assert len(summaries) == (3 if "-m" in args else 1)
    assert all(json.loads(s.read_text())["fits_budget"] for s in summaries)
    assert r.stdout.count("run folder: ") == len(summaries)
