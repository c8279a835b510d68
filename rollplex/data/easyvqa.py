"""The easy-VQA set (PyPI `easy-vqa`): 64x64 shape images, answers yes/no, shape or colour.

The package ships the questions as three lists and the images as PNG files; they become
EasyR1-style rows (`Columns`), read by the same RowSource as the user's files.
"""

from __future__ import annotations

from pathlib import Path

from rollplex.data.columns import Columns
from rollplex.data.media_checks import MediaChecks
from rollplex.data.rows import RowSource
from rollplex.data.sample import DataError
from rollplex.specs.data import DataSpec


def easyvqa_source(
    spec: DataSpec, split: str, seed: int, frames: int, checks: MediaChecks | None = None
) -> RowSource:
    try:
        import easy_vqa
    except ImportError:
        raise DataError(
            "data.source=easyvqa needs the easy-vqa package (pip install easy-vqa)"
        ) from None
    if split == "train":
        questions, answers, ids = easy_vqa.get_train_questions()
        paths, max_rows = easy_vqa.get_train_image_paths(), spec.max_rows
    elif split == "test":
        questions, answers, ids = easy_vqa.get_test_questions()
        paths, max_rows = easy_vqa.get_test_image_paths(), spec.eval_max_rows
    else:
        raise DataError(f"data source 'easyvqa' has splits train and test, not '{split}'")
    rows = {
        spec.prompt_key: list(questions),
        spec.answer_key: list(answers),
        spec.image_key: [paths[i] for i in ids],
    }
    base = Path(easy_vqa.__file__).parent
    return RowSource(
        "easyvqa",
        split,
        seed,
        Columns(rows),
        spec=spec,
        label=f"easy-vqa {split}",
        base=base,
        frames=frames,
        max_rows=max_rows,
        checks=checks,
    )
