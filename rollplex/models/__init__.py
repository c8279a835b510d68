"""Hub-format Qwen2.5-VL model folders: open and validate one, load its tokenizer,
processor and weights through transformers, write checkpoints of the same kind, and
build the embedded demo folder."""

from rollplex.models.chat_template import QWEN2_5_VL_CHAT_TEMPLATE
from rollplex.models.demo import ensure_demo_folder
from rollplex.models.files import ModelFolderError
from rollplex.models.folder import ModelFolder, open_model_folder
from rollplex.models.io import load_pretrained, save_hub_folder

__all__ = [
    "QWEN2_5_VL_CHAT_TEMPLATE",
    "ModelFolder",
    "ModelFolderError",
    "ensure_demo_folder",
    "load_pretrained",
    "open_model_folder",
    "save_hub_folder",
]
