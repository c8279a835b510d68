"""A non-editable install works: the built wheel carries conf/, and `rollplex plan` runs
from an empty folder in a fresh venv (dependencies borrowed from this interpreter's
site-packages, so nothing is downloaded)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# Without PYTHONPATH: a source checkout on it (and its build's egg-info) would stand in for
# the installed wheel, and pip would call the wheel "already satisfied".
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run(*args: str | Path, cwd: Path | None = None) -> str:
    p = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, f"{args}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_wheel_installs_and_plans_from_an_empty_folder(tmp_path: Path) -> None:
    # Build from a copy: setuptools keeps build/ beside the sources, and a stale build/lib
    # in the checkout could ship files that no longer exist (or litter the worktree).
    src = tmp_path / "src"
    for name in ("rollplex", "conf"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path / "dist"
    py = sys.executable
    run(py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "-q", "-w", dist, src)  # fmt: skip
    (wheel,) = dist.glob("rollplex-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("rollplex/") for n in names if n.startswith("rollplex/conf/")}
    source = {f"conf/{p.relative_to(ROOT / 'conf')}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert shipped == source  # every config, and nothing else

    venv = tmp_path / "venv"
    run(getattr(sys, "_base_executable", py), "-m", "venv", "--without-pip", venv)
    vpy = venv / "bin" / "python"
    site = Path(run(vpy, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    run(py, "-m", "pip", "--python", vpy, "install", "--no-deps", "--no-index", "-q", wheel)
    # Then borrow the dependencies from this interpreter's site-packages (after the install,
    # so pip never sees this interpreter's rollplex; a plain path entry: its own .pth
    # files, such as an editable rollplex, are not processed).
    (site / "borrowed_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    empty = tmp_path / "empty"
    empty.mkdir()
    where = run(vpy, "-c", "import rollplex; print(rollplex.__file__)", cwd=empty)
    assert Path(where.strip()).is_relative_to(site)
    run(venv / "bin" / "rollplex", "plan", "model=qwen2_5_vl_7b", "hardware=h200x8",
        cwd=empty)  # fmt: skip
    (summary,) = (empty / "outputs" / "plan").glob("*/summary.json")
    s = json.loads(summary.read_text())
    assert s["model"] == "qwen2_5_vl_7b" and s["gpus"] == 8 and s["step_time_s"] > 0
