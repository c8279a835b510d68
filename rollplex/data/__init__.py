"""Datasets and rewards: prompt sources yielding `Sample`s, and the reward registry.

Imports stay light (no `datasets` until a file source is built), so the backends can use
the synthetic generators without paying for it.
"""

from rollplex.data.build import SPLITS, build_source
from rollplex.data.sample import DataError, PromptSource, Sample

__all__ = ["SPLITS", "DataError", "PromptSource", "Sample", "build_source"]
