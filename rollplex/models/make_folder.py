r"""Make a random-weight Hub-format Qwen2.5-VL folder at a preset's shape, for GPU runs.

    python -m rollplex.models.make_folder --shape qwen2_5_vl_3b \
        --tokenizer-dir <dir with tokenizer.json + tokenizer_config.json> --out <folder>
Special-token ids and vocab size come from the tokenizer (Qwen2.5-VL's chat template is
written in); weights are made on the meta device, initialised on the target, saved in shards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from rollplex.models.chat_template import QWEN2_5_VL_CHAT_TEMPLATE
from rollplex.models.files import (
    CHAT_TEMPLATE_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    ModelFolderError,
)
from rollplex.models.io import DEFAULT_SHARD_SIZE, replace_folder, reset_rotary
from rollplex.specs.model import MODEL_PRESETS, ModelSpec, SpecialTokens

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_SPECIAL = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "eos_token_id": "<|im_end|>",
    "pad_token_id": "<|endoftext|>",
    "bos_token_id": "<|endoftext|>",  # Qwen's config uses <|endoftext|> as bos
}


def spec_for_tokenizer(shape: ModelSpec, tokenizer: Any) -> ModelSpec:
    """`shape` with the tokenizer's special-token ids, and its vocab grown (to a multiple
    of 64) when the tokenizer has more ids than the preset."""
    ids = {}
    for field, text in _SPECIAL.items():
        i = tokenizer.convert_tokens_to_ids(text)
        if i is None or i == tokenizer.unk_token_id:
            raise ModelFolderError(f"tokenizer has no {text} token (Qwen2.5-VL's {field})")
        ids[field] = int(i)
    vocab = (
        shape.vocab_size if len(tokenizer) <= shape.vocab_size else -(-len(tokenizer) // 64) * 64
    )
    return ModelSpec(
        **{**shape.model_dump(), "vocab_size": vocab, "special_tokens": SpecialTokens(**ids)}
    )


@torch.no_grad()
def init_random(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Normal(0, std) matrices and embeddings, zero biases, unit norm weights."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif p.ndim == 1:  # RMSNorm / LayerNorm weights
            p.fill_(1.0)
        else:
            p.normal_(0.0, std, generator=gen)


def random_model(spec: ModelSpec, dtype: torch.dtype, device: str, seed: int) -> Any:
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(spec.to_hf_config(), dtype=dtype)
    model.to_empty(device=device)
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.get_input_embeddings().weight
    init_random(model, seed)
    reset_rotary(model)
    return model.eval()


def write_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    """Copy tokenizer.json, and tokenizer_config.json with Qwen2.5-VL's chat template."""
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE):
        if not (tokenizer_dir / name).is_file():
            raise ModelFolderError(f"tokenizer folder {tokenizer_dir}: missing {name}")
    shutil.copyfile(tokenizer_dir / TOKENIZER_FILE, out / TOKENIZER_FILE)
    config = json.loads((tokenizer_dir / TOKENIZER_CONFIG_FILE).read_text())
    config["chat_template"] = QWEN2_5_VL_CHAT_TEMPLATE
    (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (out / CHAT_TEMPLATE_FILE).write_text(QWEN2_5_VL_CHAT_TEMPLATE)


def make_folder(
    shape: str,
    tokenizer_dir: str | Path,
    out: str | Path,
    dtype: str = "bfloat16",
    device: str | None = None,
    seed: int = 0,
    max_shard_size: int | str = DEFAULT_SHARD_SIZE,
    max_pixels: int | None = None,
) -> Path:
    """Write the folder (atomically: built in a temporary sibling, renamed); returns it."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    if shape not in MODEL_PRESETS:
        raise ModelFolderError(f"--shape {shape!r}: not one of {sorted(MODEL_PRESETS)}")
    if dtype not in _DTYPES:
        raise ModelFolderError(f"--dtype {dtype!r}: not one of {sorted(_DTYPES)}")
    tokenizer_dir, out = Path(tokenizer_dir), Path(out)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_tokenizer(tokenizer_dir, tmp)
        spec = spec_for_tokenizer(MODEL_PRESETS[shape], AutoTokenizer.from_pretrained(tmp))
        spec = ModelSpec(**{**spec.model_dump(), "dtype": dtype})
        model = random_model(spec, _DTYPES[dtype], device, seed)
        model.save_pretrained(tmp, max_shard_size=max_shard_size)
        del model
        v = spec.vision
        kwargs = {"max_pixels": max_pixels} if max_pixels else {}
        Qwen2VLImageProcessorPil(
            patch_size=v.patch_size,
            temporal_patch_size=v.temporal_patch_size,
            merge_size=v.spatial_merge_size,
            **kwargs,
        ).save_pretrained(tmp)
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", required=True, help=f"a preset: {', '.join(MODEL_PRESETS)}")
    p.add_argument("--tokenizer-dir", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES))
    p.add_argument("--device", default=None, help="where to initialise (default: cuda if any)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-shard-size", default=DEFAULT_SHARD_SIZE)
    p.add_argument("--max-pixels", type=int, default=None, help="image processor bound")
    a = p.parse_args(argv)
    start = time.perf_counter()
    try:
        out = make_folder(
            a.shape,
            a.tokenizer_dir,
            a.out,
            a.dtype,
            a.device,
            a.seed,
            a.max_shard_size,
            a.max_pixels,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from rollplex.models.folder import open_model_folder

    folder = open_model_folder(out)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(
        f"{out}: {a.shape} shape, vocab {folder.spec.vocab_size}, {size / 2**30:.2f} GiB, "
        f"{time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
