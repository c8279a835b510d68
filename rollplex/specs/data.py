"""DataSpec: which prompts a run trains and evaluates on (conf/data).

Sources (rollplex.data.build_source): synthetic (shapes, rollplex.data.shapes),
synthetic_video (moving shapes, rollplex.data.motion), easyvqa (the `easy-vqa` package),
jsonl / parquet (the user's file at `path`, EasyR1/verl rows).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rollplex.specs.base import Spec

SOURCES = ("synthetic", "synthetic_video", "easyvqa", "jsonl", "parquet")
FILE_SOURCES = ("jsonl", "parquet")


class DataSpec(Spec):
    source: Literal["synthetic", "synthetic_video", "easyvqa", "jsonl", "parquet"] = Field(
        "synthetic", description=f"Where prompts come from: one of {SOURCES}."
    )
    path: str | None = Field(
        None,
        description="Train file of the jsonl/parquet sources; image and frame paths in its "
        "rows are relative to the file's folder.",
    )
    eval_path: str | None = Field(
        None,
        description="Held-out file (the 'test' split) of the jsonl/parquet sources; None: "
        "the source has no test split.",
    )
    prompt_key: str = Field("problem", description="Column of the question text.")
    answer_key: str = Field("answer", description="Column of the ground-truth answer.")
    image_key: str = Field(
        "images",
        description="Column of the images: a path, bytes, {'bytes':…, 'path':…}, or a list "
        "of those. A missing column means text-only rows.",
    )
    video_key: str = Field(
        "videos",
        description="Column of the video: a video file, a list of frame paths, or a "
        "one-element list of either. A missing column means no video.",
    )
    template: str = Field(
        "{problem}",
        description="The user turn; the literal text '{problem}' is replaced with the row's "
        "question (other braces stay as written, e.g. '\\boxed{}'), e.g. "
        "'{problem} Answer with one word.'",
    )
    system_prompt: str | None = Field(
        None, description="System turn of the chat template; None: the template's default."
    )
    max_rows: int | None = Field(
        None,
        ge=1,
        description="Use only the first N rows of the train split (file order, before "
        "shuffling); the synthetic sources' train split has 1,000,000 rows otherwise.",
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="Drop the rows whose rendered prompt (visual and text tokens) is longer "
        "[data.max_prompt_length with filter_overlong_prompts], in both splits, so that a "
        "few outliers do not size every step's plan; the log says how many went. None: "
        "keep every row.",
    )
    eval_max_rows: int | None = Field(
        None,
        ge=1,
        description="Use only the first N rows of the test split; the synthetic sources' "
        "test split has 1,000 rows otherwise.",
    )
    image_size: int = Field(
        84, ge=12, description="Side in pixels of the synthetic sources' images and frames."
    )
    questions: tuple[str, ...] | None = Field(
        None,
        min_length=1,
        description="Question kinds of the synthetic sources (synthetic: count, colour; "
        "synthetic_video: direction, count); None: all of them.",
    )

    @field_validator("template")
    @classmethod
    def _template_has_problem(cls, v: str) -> str:
        if "{problem}" not in v:
            raise ValueError(f"template must contain '{{problem}}', got {v!r}")
        return v

    @model_validator(mode="after")
    def _files_for_file_sources(self) -> DataSpec:
        if self.source in FILE_SOURCES and not self.path:
            raise ValueError(f"data source '{self.source}' needs data.path=<file>")
        if self.source not in FILE_SOURCES and (self.path or self.eval_path):
            raise ValueError(f"data.path/eval_path are for {FILE_SOURCES}, not '{self.source}'")
        if self.questions is not None and not self.source.startswith("synthetic"):
            raise ValueError(f"data.questions is for the synthetic sources, not '{self.source}'")
        return self

    def user_turn(self, problem: str) -> str:
        """The template filled with one row's question."""
        return self.template.replace("{problem}", problem)


DATA_PRESETS: dict[str, DataSpec] = {
    "synthetic": DataSpec(source="synthetic"),
    "synthetic_video": DataSpec(source="synthetic_video"),
    "easyvqa": DataSpec(source="easyvqa", template="{problem} Answer with one word."),
}
