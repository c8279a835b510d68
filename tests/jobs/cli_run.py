"""Running `rollplex` as a user does, for the CLI tests: in a subprocess (the real exit
code and streams), or in this process (no interpreter start-up or torch import per case:
the refusals that come after the job's imports stay fast)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def rollplex(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m rollplex.cli *args` in `cwd` (created), with `env` added to the environ."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "rollplex.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@dataclass(slots=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def exit_code(args: tuple[str, ...]) -> int:
    """`rollplex.cli.main(args)` in this process, the exit code it ends with (0 if none)."""
    from rollplex import cli

    try:
        cli.main(list(args))
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0


def rollplex_in_process(cwd: Path, *args: str) -> Result:
    """`rollplex *args` through `rollplex.cli.main` in this process, run from `cwd`, its
    streams kept: for fixtures of any scope (a module's shared runs), where `rollplex_here`'s
    function-scoped fixtures cannot go. The working directory, argv and the torch settings
    the job makes are restored after; the loggers, by conftest's autouse fixture."""
    cwd.mkdir(parents=True, exist_ok=True)
    out, err = io.StringIO(), io.StringIO()
    with (
        pytest.MonkeyPatch.context() as patch,
        torch_settings_kept(),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        patch.chdir(cwd)
        patch.setattr(sys, "argv", list(sys.argv))  # main() rewrites it for Hydra
        code = exit_code(args)
    return Result(code, out.getvalue(), err.getvalue())


def rollplex_here(cwd: Path, monkeypatch, capsys, *args: str) -> Result:
    """`rollplex *args` through `rollplex.cli.main` in this process, run from `cwd` (for
    the rest of the test), its streams read from `capsys`."""
    cwd.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() rewrites it for Hydra
    capsys.readouterr()
    code = exit_code(args)
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


@contextlib.contextmanager
def torch_settings_kept() -> Iterator[None]:
    """Undo what a train or eval job run in this process sets for the whole process (torch's
    thread count, deterministic algorithms), so that later tests see the worker's own."""
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def shown_lines(stream: str) -> list[str]:
    """The lines a terminal is left showing: a progress bar redraws its line with carriage
    returns and clears it when done (the data check's bar appears only when it runs slow,
    as on a loaded CI machine), so only what follows a line's last one stays."""
    shown = (line.rsplit("\r", 1)[-1].rstrip() for line in stream.split("\n"))
    return [line for line in shown if line]


def refusal_line(result: Result | subprocess.CompletedProcess[str]) -> str:
    """The one line a refusal prints (exit code 2, no traceback)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [ln for ln in shown_lines(result.stderr) if ln.startswith("rollplex:")]
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


def run_dir(cwd: Path, job: str) -> Path:
    (out,) = (cwd / "outputs" / job).iterdir()
    return out


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
