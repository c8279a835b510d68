"""The vLLM rollout role (see rollout.py). Importing this package does not import vllm:
`VllmRollout(...)` does, and raises BackendUnavailable, naming what to install, where
vllm is missing."""

from rollplex.backends.vllm.decode import VllmDecode
from rollplex.backends.vllm.engine import INSTALL_HINT, require_vllm
from rollplex.backends.vllm.folder import ModelFolderError, check_model_folder
from rollplex.backends.vllm.prompts import VllmPrompts
from rollplex.backends.vllm.rollout import VllmRollout

__all__ = [
    "INSTALL_HINT",
    "ModelFolderError",
    "VllmDecode",
    "VllmPrompts",
    "VllmRollout",
    "check_model_folder",
    "require_vllm",
]
