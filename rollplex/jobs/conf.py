"""Where the Hydra configs are: the wheel's rollplex/conf, else the checkout's conf/."""

from __future__ import annotations

from pathlib import Path


def conf_dir() -> str:
    """The Hydra configs: rollplex/conf in an installed wheel (setup.py copies it there),
    else the source checkout's top-level conf/ (the one source of truth)."""
    here = Path(__file__).resolve().parent.parent  # rollplex/
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise SystemExit(f"rollplex: no configs found in {here / 'conf'} or {here.parent / 'conf'}")


__all__ = ["conf_dir"]
