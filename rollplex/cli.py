"""`rollplex <job> [hydra overrides]`: the one console entry point.

The job (graph, plan, train) is the first argument; the rest are Hydra overrides, so
`rollplex plan -m schedule=serial,rollplex` sweeps. The config is validated once, here,
into a RunSpec; a bad field ends the run with one paragraph naming it and exit code 2,
before any model is built.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

JOBS = ("graph", "plan", "train", "eval", "weights")


def _conf_dir() -> str:
    """The Hydra configs: rollplex/conf in an installed wheel (setup.py copies it there),
    else the source checkout's top-level conf/ (the one source of truth)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise SystemExit(f"rollplex: no configs found in {here / 'conf'} or {here.parent / 'conf'}")


log = logging.getLogger("rollplex")


def main(argv: list[str] | None = None) -> None:
    from rollplex.jobs.logs import take_verbose_flag

    argv = take_verbose_flag(list(sys.argv[1:] if argv is None else argv))  # --verbose
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in JOBS:
        print(
            f"usage: rollplex {{{','.join(JOBS)}}} [hydra overrides]\n"
            "  e.g. rollplex graph model=qwen2_5_vl_7b algo=grpo workload.group_size=8\n"
            "       rollplex plan -m schedule=serial,disaggregated,rollplex\n"
            "       rollplex train model=tiny workload=tiny hardware=cpu\n"
            "       rollplex eval model.path=outputs/train/<run>/checkpoints/step-000200\n"
            "       rollplex weights model=qwen2_5_vl_32b weights.train_fsdp=8 weights.rollout_tp=4"
        )
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    job, overrides = argv[0], argv[1:]
    import hydra  # imported late: `rollplex --help` stays instant

    sys.argv = [f"rollplex-{job}", *overrides, f"job={job}"]
    # `train` defaults to a tiny CPU run (conf/train.yaml); the planning jobs to 7B on H200s.
    config = "train" if job in ("train", "eval") else "config"
    hydra.main(config_path=_conf_dir(), config_name=config, version_base="1.3")(_run)()
    from rollplex.jobs.sweep import FAILED_RUNS

    if FAILED_RUNS:  # a sweep went on past them; say so in the exit code
        print(f"rollplex: {len(FAILED_RUNS)} run(s) of the sweep failed", file=sys.stderr)
        sys.exit(1)


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
        lines.append(f"'{where}': {e['msg']} (got {e.get('input')!r})")
    return "invalid config: " + "; ".join(lines) + ". Fix the field(s) named above."


def _fail(message: str) -> None:
    print(f"rollplex: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
