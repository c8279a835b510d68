from __future__ import annotations

import pytest

from rollplex.algos import build_step
from rollplex.graph.ir import Graph
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec


@pytest.fixture
def grpo_7b() -> Graph:
    return build_step(MODEL_PRESETS["qwen2_5_vl_7b"], WORKLOAD_PRESETS["video"], AlgoSpec())


@pytest.fixture
def grpo_tiny() -> Graph:
    return build_step(MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec())
