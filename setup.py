"""Build step for the wheel: ship the top-level conf/ (the one source of truth for the Hydra
configs) inside the package as rollplex/conf, where `rollplex.cli` looks first.

Everything else is in pyproject.toml; a source checkout uses conf/ in place."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithConf(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "rollplex" / "conf"
        shutil.copytree(ROOT / "conf", target, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithConf})
