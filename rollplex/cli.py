"""`rollplex <job> [hydra overrides]`: the one console entry point.

The job is the first argument, the rest are Hydra overrides (`rollplex plan -m
schedule=serial,rollplex` sweeps). Overrides are checked and a run folder claimed before
Hydra runs; the config becomes a RunSpec once, here, and a bad field ends the run with one
line naming it and exit code 2. `--help` texts are written from conf/ and the specs.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

JOBS = ("graph", "plan", "train", "eval", "weights")
# Hydra's own flags that take a value (the value is not an override).
_VALUE_FLAGS = frozenset(
    {
        "--cfg",
        "-c",
        "--package",
        "-p",
        "--config-path",
        "-cp",
        "--config-name",
        "-cn",
        "--config-dir",
        "-cd",
        "--experimental-rerun",
    }
)


def _conf_dir() -> str:
    from rollplex.jobs.conf import conf_dir  # jobs/ finds them (it needs them too)

    return conf_dir()


log = logging.getLogger("rollplex")


def main(argv: list[str] | None = None) -> None:
    from rollplex.jobs.logs import take_verbose_flag

    argv = take_verbose_flag(list(sys.argv[1:] if argv is None else argv))  # --verbose
    if not argv or argv[0] in ("-h", "--help"):
        from rollplex.jobs.cli_help import general_help

        print(general_help(_conf_dir()))
        sys.exit(0 if argv else 2)
    if argv[0] not in JOBS:
        _fail(f"unknown job '{argv[0]}': the jobs are {', '.join(JOBS)} (rollplex --help)")
    job, rest = argv[0], argv[1:]
    overrides, multirun, wants_help = _split(rest)
    # `train` defaults to a tiny CPU run (conf/train.yaml); the planning jobs to 7B on 8 H200s.
    config = "train" if job in ("train", "eval") else "config"
    from rollplex.jobs.overrides import ConfigError, check_overrides
    from rollplex.jobs.run_folder import folder_overrides

    try:
        if wants_help is not None:
            _help(job, config, overrides, wants_help)
            return
        checked = check_overrides(_conf_dir(), config, job, overrides, multirun)
        # Hydra's informational flags (--cfg job, --info...) run nothing: no folder to claim.
        runs = not any(a.startswith("-") and a not in ("-m", "--multirun") for a in rest)
        folder = folder_overrides(checked.cfg, multirun) if runs else []
    except ConfigError as err:
        _fail(str(err))
    import hydra  # imported late: `rollplex --help` stays instant

    sys.argv = [f"rollplex-{job}", *rest, *folder, f"job={job}"]
    hydra.main(config_path=_conf_dir(), config_name=config, version_base="1.3")(_run)()
    from rollplex.jobs.sweep import FAILED_RUNS

    if FAILED_RUNS:  # a sweep went on past them; say so in the exit code
        print(f"rollplex: {len(FAILED_RUNS)} run(s) of the sweep failed", file=sys.stderr)
        sys.exit(1)


def _split(args: list[str]) -> tuple[list[str], bool, list[str] | None]:
    """(the overrides, multirun?, the sections asked for by --help or None)."""
    overrides, multirun, wants_help, skip = [], False, None, False
    for a in args:
        if skip:
            skip = False
        elif a in ("-m", "--multirun"):
            multirun = True
        elif a in ("-h", "--help"):
            wants_help = []
        elif a in _VALUE_FLAGS:
            skip = True
        elif a.startswith("-"):
            continue
        elif wants_help is not None and "=" not in a:
            wants_help.append(a)  # `rollplex train --help train`: one section
        else:
            overrides.append(a)
    return overrides, multirun, wants_help


def _help(job: str, config: str, overrides: list[str], sections: list[str]) -> None:
    from rollplex.jobs.cli_help import job_help
    from rollplex.jobs.overrides import check_overrides

    checked = check_overrides(_conf_dir(), config, job, overrides, multirun=True)
    print(job_help(_conf_dir(), job, checked.cfg, sections))


def _run(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rollplex.jobs.logs import setup_logging

    setup_logging()  # after Hydra made its handlers: quiet unless --verbose
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        message = _run_checked(cfg, out)
    except Exception as err:
        if not multirun:
            raise  # a bug: its traceback is the report
        log.exception("run '%s' crashed", out.name)  # the traceback, in the run's log
        message = f"{type(err).__name__}: {err}"
    if message is None:
        return
    if multirun:  # one bad run must not end the sweep
        from rollplex.jobs.sweep import record_failure

        record_failure(out, cfg, message)
        print(f"rollplex: run '{out.name}' failed: {message}", file=sys.stderr)
        return
    _fail(message)


def _run_checked(cfg, out: Path) -> str | None:
    """Validate and run the job; the one-line reason it could not, or None."""
    from omegaconf import OmegaConf
    from pydantic import ValidationError

    from rollplex.jobs import run_job
    from rollplex.specs.run import RunSpec

    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        spec = RunSpec.model_validate(raw)
    except ValidationError as err:
        return _explain(err)
    except Exception as err:  # missing values, bad interpolations
        return f"invalid config: {err}"
    try:
        run_job(spec, out)
    except (ValueError, FileNotFoundError) as err:  # bad input found before GPU work
        return str(err)
    return None


def _explain(err) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r:.80})"  # a section: too long
        lines.append(f"'{where}': {e['msg']}{shown}")
    return "invalid config: " + "; ".join(lines) + ". Fix the field(s) named above."


def _fail(message: str) -> None:
    print(f"rollplex: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
