"""`rollplex eval`: greedy accuracy of a model folder on a data split.

`model.path=<run>/checkpoints/step-NNNNNN` scores a train checkpoint the way its run scored
it: the run's `config.json` gives the generation cap, prompts, data, workload, preset, seed
and threads unless the command line sets them, and both score `exact_match` on greedy
answers. summary.json gets the accuracy, the majority-answer baseline and a few examples.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from rollplex.specs.model import HUB, ModelSpec
from rollplex.specs.run import RunSpec

log = logging.getLogger(__name__)

# Settings a checkpoint's training run decides unless the command line names them.
INHERITED = ("data", "workload", "model", "seed")
DEFAULT_PROMPTS, DEFAULT_MAX_NEW_TOKENS = 200, 8  # a folder that no rollplex run wrote


def training_run_config(model_path: str | None) -> Path | None:
    """The `config.json` of the train run that wrote checkpoint `model_path` (the
    checkpoint, its `model/`, or a folder under a run folder), or None."""
    if model_path is None:
        return None
    folder = Path(model_path).expanduser().resolve()
    for parent in [folder, *folder.parents][:4]:  # model/ -> step-N/ -> checkpoints/ -> run/
        path = parent / "config.json"
        if not path.is_file():
            continue
        try:
            raw = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(raw, dict) and raw.get("job") == "train":
            return path
    return None


def command_line_keys() -> set[str]:
    """The keys this run's command line set (`data.template=x` -> "data.template"); empty
    outside Hydra (a programmatic call sets its spec's fields itself)."""
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:  # pragma: no cover - hydra is a dependency
        return set()
    if not HydraConfig.initialized():
        return set()
    keys = set()
    for item in HydraConfig.get().overrides.task:
        keys.add(item.split("=", 1)[0].lstrip("+~"))
    return keys


def _named(keys: set[str], group: str) -> bool:
    return any(k == group or k.startswith(f"{group}.") for k in keys if k != "model.path")


def settings_from_run(spec: RunSpec, run_config: Path | None, keys: set[str]) -> RunSpec:
    """`spec` with what the training run decided filled in (see the module docstring)."""
    if run_config is None:
        e = spec.eval
        return spec.model_copy(
            update={
                "eval": e.model_copy(
                    update={
                        "prompts": e.prompts or DEFAULT_PROMPTS,
                        "max_new_tokens": e.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                    }
                )
            }
        )
    try:
        run = RunSpec.model_validate_json(run_config.read_text())
    except ValueError as err:
        raise ValueError(
            f"{run_config}: the training run's config does not validate ({err}); set "
            "eval.max_new_tokens and eval.prompts and give model.path its model/ folder copy"
        ) from err
    update: dict[str, Any] = {g: getattr(run, g) for g in INHERITED if not _named(keys, g)}
    if "model" in update and spec.model.path is not None:
        # the checkpoint's own config.json describes it (the run's preset may have named
        # the embedded demo folder); the run's dtype is what it computed in
        update["model"] = ModelSpec.model_validate(
            {"name": HUB, "path": spec.model.path, "dtype": run.model.dtype}
        )
    e = spec.eval
    update["eval"] = e.model_copy(
        update={
            "prompts": e.prompts or run.train.eval_prompts,
            "max_new_tokens": e.max_new_tokens or run.train.max_new_tokens,
        }
    )
    if not _named(keys, "train"):
        update["train"] = spec.train.model_copy(
            update={"threads": run.train.threads, "deterministic": run.train.deterministic}
        )
    return spec.model_copy(update=update)


def run_eval(spec: RunSpec, out: Path) -> dict[str, Any]:
    from rollplex.data import build_source
    from rollplex.jobs.prepare import media_checks, model_folder, renderer_for, within_prompt_cap

    run_config = training_run_config(spec.model.path)
    spec = settings_from_run(spec, run_config, command_line_keys())
    e = spec.eval
    if run_config is not None:
        log.info(
            "scoring as the training run did (%s): max_new_tokens=%d, %d prompts, seed %d",
            run_config,
            e.max_new_tokens,
            e.prompts,
            spec.seed,
        )
    from rollplex.runtime.compose import check_roles

    check_roles(spec.backend)  # BackendUnavailable says what to install, before any load
    folder = model_folder(spec)  # checked before any weights load
    frames = spec.workload.frames
    source = build_source(spec.data, e.split, spec.seed, frames=frames, checks=media_checks())
    renderer = renderer_for(spec, folder, spec.workload)
    source = within_prompt_cap(spec, source, renderer)  # the prompts the run evaluated

    import torch

    from rollplex.backends.step import StepConfig
    from rollplex.runtime.compose import compose
    from rollplex.runtime.evaluate import evaluate

    if spec.train.threads:
        torch.set_num_threads(spec.train.threads)
    if spec.train.deterministic:  # as the train job: cuBLAS needs it to be deterministic
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(spec.train.deterministic)
    torch.manual_seed(spec.seed)
    config = StepConfig(folder.spec, spec.algo, spec.seed, e.max_new_tokens, device=e.device)
    backend = compose(config, spec.backend)
    from rollplex.data.rewards import accuracy_scorer

    score = accuracy_scorer(spec.reward)  # the run's own reward; exact match beside it
    res = evaluate(
        backend, source, renderer, e.prompts, e.max_new_tokens, score=score,
        n=e.samples, temperature=e.temperature, top_p=e.top_p,
    )  # fmt: skip
    sampled = (
        f" over {e.samples} answers a prompt at temperature {e.temperature:g} (mean@"
        f"{e.samples}; pass@{e.samples} {res.pass_at_n:.3f})"
        if e.samples > 1
        else ""
    )
    print(
        f"accuracy {res.accuracy:.3f} by {res.scored_by}{sampled} (exact match "
        f"{res.exact_match_accuracy:.3f}) on {res.prompts} {e.split} prompts of "
        f"'{source.name}' (always '{res.majority_answer}': {res.majority_accuracy:.3f}); "
        f"folder {folder.path}"
    )
    return {
        "model_path": str(folder.path),
        "data": source.name,
        "split": e.split,
        "accuracy": res.accuracy,
        "scored_by": res.scored_by,
        "exact_match_accuracy": res.exact_match_accuracy,
        "samples": e.samples,
        "temperature": e.temperature,
        "pass_at_n": res.pass_at_n,
        "prompts": res.prompts,
        "max_new_tokens": e.max_new_tokens,
        "settings_from": str(run_config) if run_config is not None else None,
        "majority_answer": res.majority_answer,
        "majority_accuracy": res.majority_accuracy,
        "examples": [list(x) for x in res.examples],
    }
