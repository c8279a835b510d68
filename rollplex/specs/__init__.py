"""User-facing specs: pydantic models, frozen, validated once on the driver."""

from rollplex.specs.algo import AlgoSpec
from rollplex.specs.base import Spec
from rollplex.specs.data import DATA_PRESETS, DataSpec
from rollplex.specs.hardware import HARDWARE_PRESETS, HardwareSpec
from rollplex.specs.model import MODEL_PRESETS, ModelSpec, SpecialTokens, VisionSpec
from rollplex.specs.reward import REWARD_PRESETS, RewardComponentSpec, RewardSpec
from rollplex.specs.schedule import ParallelSpec, ScheduleSpec
from rollplex.specs.workload import WORKLOAD_PRESETS, ResponseLengthSpec, WorkloadSpec

__all__ = [
    "DATA_PRESETS",
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "REWARD_PRESETS",
    "WORKLOAD_PRESETS",
    "AlgoSpec",
    "DataSpec",
    "HardwareSpec",
    "ModelSpec",
    "ParallelSpec",
    "ResponseLengthSpec",
    "RewardComponentSpec",
    "RewardSpec",
    "ScheduleSpec",
    "Spec",
    "SpecialTokens",
    "VisionSpec",
    "WorkloadSpec",
]
