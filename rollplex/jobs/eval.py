"""`rollplex eval`: greedy accuracy of a model folder on a data split.

A train checkpoint is a Hub-format folder, so `model.path=<run>/checkpoints/step-NNNNNN`
scores it; the run folder gets `summary.json` with the accuracy, the majority-answer
baseline of the same prompts and a few examples.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rollplex.specs.run import RunSpec

log = logging.getLogger(__name__)


def run_eval(spec: RunSpec, out: Path) -> dict[str, Any]:
    from rollplex.data import build_source
    from rollplex.jobs.prepare import model_folder, renderer_for

    e = spec.eval
    folder = model_folder(spec)  # checked before any weights load
    source = build_source(spec.data, e.split, spec.seed, frames=spec.workload.frames)
    renderer = renderer_for(spec, folder, spec.workload)

    import torch

    from rollplex.runtime.compose import compose
    from rollplex.runtime.dispatch import StepConfig
    from rollplex.runtime.evaluate import evaluate

    torch.manual_seed(spec.seed)
    config = StepConfig(folder.spec, spec.algo, spec.seed, e.max_new_tokens, device=e.device)
    backend = compose(config, spec.backend)
    from rollplex.data.rewards import accuracy_scorer

    score = accuracy_scorer(spec.reward)  # the run's own reward; exact match beside it
    res = evaluate(backend, source, renderer, e.prompts, e.max_new_tokens, score=score)
    print(
        f"accuracy {res.accuracy:.3f} by {res.scored_by} (exact match "
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
        "prompts": res.prompts,
        "majority_answer": res.majority_answer,
        "majority_accuracy": res.majority_accuracy,
        "examples": [list(x) for x in res.examples],
    }
