"""Columns answers every call RowSource makes as a datasets.Dataset of the same rows does,
and a RowSource over either yields the same samples."""

from __future__ import annotations

import datasets
import pytest

from rollplex.data.columns import Columns
from rollplex.data.rows import RowSource
from rollplex.specs.data import DataSpec

ROWS = {
    "problem": [f"<image>How many shapes in picture {i}?" for i in range(7)],
    "answer": ["1", "2", "3", "yes", "no", "4", "5"],
    "images": [[f"{i % 3}.png"] for i in range(7)],
}


def test_columns_answer_as_a_dataset_does():
    cols, ds = Columns(ROWS), datasets.Dataset.from_dict(ROWS)
    assert cols.column_names == ds.column_names and len(cols) == len(ds) == 7
    for key in (0, 6, -1, slice(2, 5), slice(0, 1024), "answer"):
        assert cols[key] == ds[key], key
    assert cols["problem"][:] == ds["problem"][:]
    small, small_ds = cols.select(range(3)), ds.select(range(3))
    assert len(small) == len(small_ds) == 3 and small[0:3] == small_ds[0:3]
    picked = cols.select_columns(["answer", "images"])
    assert picked.column_names == ["answer", "images"]
    assert picked[1:4] == ds.select_columns(["answer", "images"])[1:4]


def test_columns_of_unequal_length_are_refused():
    with pytest.raises(ValueError, match="unequal length"):
        Columns({"problem": ["a", "b"], "answer": ["1"]})


def test_a_row_source_reads_the_same_samples_from_either(tmp_path):
    from PIL import Image

    for i in range(3):
        Image.new("RGB", (28 + 28 * i, 28), (i * 80, 0, 0)).save(tmp_path / f"{i}.png")
    spec = DataSpec(source="jsonl", path=str(tmp_path / "unused.jsonl"))

    def source(table) -> RowSource:
        return RowSource("rows", "train", 0, table, spec=spec, label="rows", base=tmp_path,
                         frames=2, max_rows=5)  # fmt: skip

    a, b = source(Columns(ROWS)), source(datasets.Dataset.from_dict(ROWS))
    assert len(a) == len(b) == 5 and a.media == b.media
    assert list(a.prompt_rows()) == list(b.prompt_rows())
    for x, y in zip(a.batch(0, 5), b.batch(0, 5), strict=True):
        assert (x.uid, x.problem, x.answer) == (y.uid, y.problem, y.answer)
        assert [im.tobytes() for im in x.images] == [im.tobytes() for im in y.images]
