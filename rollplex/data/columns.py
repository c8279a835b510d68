"""Rows held as Python lists, read through the few `datasets.Dataset` calls RowSource makes.

The easy-VQA set arrives as three in-memory lists: wrapping them in a Dataset cost every
run `datasets`' import (~0.35 s, with pandas and pyarrow) and an Arrow copy. Files keep
`datasets`, which maps them from disk instead of holding them in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, frozen=True)
class Columns:
    """Equal-length columns by name: `len`, `column_names`, `select`, `select_columns`, and
    indexing by row, by slice (a dict of lists) and by column, as a Dataset answers them."""

    data: dict[str, list[Any]]

    def __post_init__(self) -> None:
        lengths = {name: len(col) for name, col in self.data.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of unequal length: {lengths}")

    @property
    def column_names(self) -> list[str]:
        return list(self.data)

    def __len__(self) -> int:
        return len(next(iter(self.data.values()), []))

    def select(self, rows: range) -> Columns:
        return Columns({name: [col[i] for i in rows] for name, col in self.data.items()})

    def select_columns(self, names: list[str]) -> Columns:
        return Columns({name: self.data[name] for name in names})

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            return self.data[key]
        return {name: col[key] for name, col in self.data.items()}  # a row, or a dict of lists
