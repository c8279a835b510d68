"""The embedded default model folder: a tiny random-weight Qwen2.5-VL with a real BPE
tokenizer, built on first use and cached.

The tokenizer is byte-level BPE trained on easy-vqa's and the synthetic tasks' words (every
answer one token), with Qwen2.5-VL's special tokens and chat template. The cache folder is
named by a hash of the recipe, and built in a temporary folder renamed into place.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
from pathlib import Path

from rollplex.models import chat_template
from rollplex.models.chat_template import QWEN2_5_VL_CHAT_TEMPLATE
from rollplex.specs.model import MODEL_PRESETS, ModelSpec, SpecialTokens

# Qwen2.5-VL's special tokens, in Qwen's order (ids 0..6 here).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
TARGET_VOCAB = 640  # 256 byte symbols, 7 specials, the rest merges
DEMO_MAX_PIXELS = 112 * 112  # at most 16 merged visual tokens per image
FORMAT_WORDS = ("<answer>", "</answer>", "answer", "\\boxed{}")


def rollplex_home() -> Path:
    return Path(os.environ.get("ROLLPLEX_HOME") or Path.home() / ".cache" / "rollplex")


def recipe_hash() -> str:
    import rollplex.data

    h = hashlib.sha256()
    data = Path(rollplex.data.__file__).parent
    for path in (__file__, chat_template.__file__, data / "shapes.py", data / "motion.py"):
        h.update(Path(path).read_bytes())
    for dist in ("transformers", "tokenizers", "easy-vqa"):
        h.update(f"{dist}={importlib.metadata.version(dist)};".encode())
    return h.hexdigest()[:12]


def ensure_demo_folder(root: str | Path | None = None) -> Path:
    """The demo model folder under `root` (default: $ROLLPLEX_HOME or ~/.cache/rollplex),
    built if this recipe's folder is not there yet. Returns its path."""
    root = Path(root) if root is not None else rollplex_home()
    final = root / f"demo-qwen2_5_vl-{recipe_hash()}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build_demo_folder(tmp)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished first: its folder is the same recipe
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def corpus() -> list[str]:
    """Training text: easy-vqa's questions and answers (train and test) and the synthetic
    image and video tasks' questions and answers; answers also stand alone, as a response
    starts, and chat roles appear as the template writes them."""
    import easy_vqa

    from rollplex.data import motion, shapes

    lines: list[str] = []
    answers = [*easy_vqa.get_answers(), *shapes.ANSWER_WORDS, *motion.ANSWER_WORDS]
    for get in (easy_vqa.get_train_questions, easy_vqa.get_test_questions):
        questions, qa_answers, _ = get()
        lines += questions
        lines += qa_answers
    lines += [*shapes.QUESTIONS.values(), *motion.QUESTIONS.values()] * 100
    lines += ["system", "user", "assistant", "You are a helpful assistant."] * 100
    lines += [f"{w}" for w in answers for _ in range(200)]
    lines += [f" {w}" for w in answers for _ in range(200)]
    lines += [f"<answer>{w}</answer>" for w in answers for _ in range(20)]
    lines += list(FORMAT_WORDS) * 100
    return lines


def train_tokenizer(lines: list[str], vocab_size: int = TARGET_VOCAB):
    """A byte-level BPE `PreTrainedTokenizerFast` with Qwen2.5-VL's specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="right",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    fast.chat_template = QWEN2_5_VL_CHAT_TEMPLATE
    return fast


def demo_spec(vocab_size: int) -> ModelSpec:
    """The tiny preset's shapes, Qwen2.5-VL's token layout at ids 0..6."""
    return MODEL_PRESETS["tiny"].model_copy(
        update={
            "name": "demo",
            "vocab_size": vocab_size,
            "special_tokens": SpecialTokens(
                pad_token_id=0,
                bos_token_id=0,
                eos_token_id=2,
                vision_start_token_id=3,
                vision_end_token_id=4,
                image_token_id=5,
                video_token_id=6,
            ),
        }
    )


def build_demo_folder(folder: Path, seed: int = 0) -> Path:
    """Write the demo folder's files into `folder` (not atomic: see ensure_demo_folder)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    tok = train_tokenizer(corpus())
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens landed at ids {ids}, expected 0..6")
    spec = demo_spec(len(tok))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration._from_config(
            spec.to_hf_config(), dtype=torch.float32
        )
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(QWEN2_5_VL_CHAT_TEMPLATE)
    v = spec.vision
    factor = v.patch_size * v.spatial_merge_size
    Qwen2VLImageProcessorPil(
        patch_size=v.patch_size,
        temporal_patch_size=v.temporal_patch_size,
        merge_size=v.spatial_merge_size,
        min_pixels=factor * factor,
        max_pixels=DEMO_MAX_PIXELS,
    ).save_pretrained(folder)
    return folder
