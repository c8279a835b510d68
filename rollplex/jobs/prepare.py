"""Everything a model-running job needs, checked before any model loads.

`prepare(spec)` opens the model folder (the embedded demo folder when the preset names
none), the data sources and the reward, and renders the first batches to measure the
workload the planner sizes. Any bad input (a missing tokenizer file, a row without its
image, an unknown reward) raises a ValueError naming it here, before weights are read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from rollplex.data import PromptSource, build_source
from rollplex.data.media_checks import MediaChecks
from rollplex.data.order import IndexedSource
from rollplex.data.prompt_filter import keep_prompts_within
from rollplex.data.render import PromptRenderer
from rollplex.data.rewards import Reward, build_reward
from rollplex.data.rewards.overlong import OverlongPenalty
from rollplex.data.steps import MeasuredShape, StepData, measure_shape, measured_workload
from rollplex.jobs.model_dtype import as_held
from rollplex.models import ModelFolder, ensure_demo_folder, open_model_folder
from rollplex.runtime.compile_cache import cache_root
from rollplex.runtime.scoring import ResponseScorer
from rollplex.specs import ModelSpec, WorkloadSpec
from rollplex.specs.data import FILE_SOURCES
from rollplex.specs.run import RunSpec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Prepared:
    folder: ModelFolder
    model: ModelSpec  # as config.json describes it, in the dtype the run holds it in
    workload: WorkloadSpec  # visual and text lengths measured from the data
    shape: MeasuredShape
    renderer: PromptRenderer
    train: StepData
    eval_source: PromptSource | None
    reward: Reward
    scorer: ResponseScorer


def model_folder(spec: RunSpec) -> ModelFolder:
    """`model.path`, or the embedded demo folder for the tiny preset."""
    path = spec.model.path
    if path is None:
        if spec.model.name != "tiny":
            raise ValueError(
                f"model.path: model '{spec.model.name}' runs from a Hub-format folder; give "
                "model.path=<folder> (the preset must match its config.json), or "
                "model=hub model.path=<folder> to take the architecture from the folder "
                "(python -m rollplex.models.make_folder builds a random-weight one at any "
                "preset's shape)"
            )
        path = ensure_demo_folder()
        return open_model_folder(Path(path))
    return open_model_folder(Path(path), preset=spec.model)


def renderer_for(spec: RunSpec, folder: ModelFolder, workload: WorkloadSpec) -> PromptRenderer:
    pixels = workload.height * workload.width
    return PromptRenderer(
        folder.tokenizer(),
        folder.image_processor(),
        folder.spec,
        template=spec.data.template,
        system_prompt=spec.data.system_prompt,
        max_pixels=pixels,
        video_max_pixels=pixels,
    )


def media_checks() -> MediaChecks:
    """Earlier runs' decodes of media files (<cache root>/media_checks.json,
    data/media_checks.py), read once a run and shared by its splits: `build_source` decodes
    only the files that changed since."""
    return MediaChecks.load(cache_root() / "media_checks.json")


def overlong_penalty(spec: RunSpec) -> OverlongPenalty | None:
    """reward.overlong_buffer's penalty at this run's response cap (None: off)."""
    r = spec.reward
    if r.overlong_buffer == 0:
        return None
    return OverlongPenalty(spec.train.max_new_tokens, r.overlong_buffer, r.overlong_penalty)


def within_prompt_cap(
    spec: RunSpec, source: IndexedSource, renderer: PromptRenderer
) -> IndexedSource:
    """`source` less the rows over data.max_prompt_tokens (as it is where that is unset)."""
    cap = spec.data.max_prompt_tokens
    return source if cap is None else keep_prompts_within(source, renderer, cap)


def prepare(spec: RunSpec, eval_split: bool = True, folder: ModelFolder | None = None) -> Prepared:
    folder = folder or model_folder(spec)
    frames = spec.workload.frames
    checks = media_checks()
    train_source = build_source(spec.data, "train", spec.seed, frames=frames, checks=checks)
    if eval_split and spec.data.source in FILE_SOURCES and spec.data.eval_path is None:
        log.warning(
            "no held-out split (data.eval_path is not set): held-out accuracy is not logged"
        )
        eval_split = False
    eval_source = (
        build_source(spec.data, "test", spec.seed, frames=frames, checks=checks)
        if eval_split
        else None
    )
    reward = build_reward(spec.reward)
    renderer = renderer_for(spec, folder, spec.workload)
    train_source = within_prompt_cap(spec, train_source, renderer)
    if eval_source is not None:
        eval_source = within_prompt_cap(spec, eval_source, renderer)
    data = StepData(train_source, renderer, spec.workload.prompts_per_step)
    shape = measure_shape(data, folder.spec)
    data.limits = shape  # a row longer than the plan's sizing is refused by name
    workload = measured_workload(spec.workload, shape)
    log.info(
        "data '%s': %d train rows; prompts carry up to %d visual + %d text tokens (%d frames; "
        "measured over %d prompts)",
        train_source.name,
        len(train_source),
        shape.visual_tokens,
        shape.text_tokens,
        shape.frames,
        shape.prompts_seen,
    )
    scorer = ResponseScorer(renderer.tokenizer, reward, overlong_penalty(spec))
    model, note = as_held(folder.spec, spec)
    if note:
        log.info("%s", note)
    return Prepared(folder, model, workload, shape, renderer, data, eval_source, reward, scorer)
