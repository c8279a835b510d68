"""ModelSpec: the shapes of a Qwen2.5-VL model, enough to count its parameters,
price its ops and build the real transformers model from the same numbers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec


class VisionSpec(Spec):
    """The Qwen2.5-VL vision tower: a ViT with window attention and a 2x2 patch merger."""

    depth: int = Field(32, ge=1, description="Number of ViT blocks.")
    hidden_size: int = Field(1280, ge=1, description="ViT hidden width.")
    num_heads: int = Field(16, ge=1, description="ViT attention heads.")
    intermediate_size: int = Field(3420, ge=1, description="SwiGLU width of each ViT block.")
    out_hidden_size: int = Field(
        ..., ge=1, description="Width the patch merger projects to (the LLM hidden size)."
    )
    patch_size: int = Field(14, ge=1, description="Spatial patch edge in pixels.")
    temporal_patch_size: int = Field(2, ge=1, description="Frames folded into one patch.")
    spatial_merge_size: int = Field(2, ge=1, description="Merger folds merge x merge patches.")
    window_size: int = Field(112, ge=1, description="Window-attention edge in pixels.")
    fullatt_block_indexes: tuple[int, ...] = Field(
        (7, 15, 23, 31), description="Blocks that use full instead of window attention."
    )
    in_channels: int = Field(3, ge=1, description="Image channels.")

    @model_validator(mode="after")
    def _check(self) -> VisionSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError("vision.hidden_size must be divisible by vision.num_heads")
        bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"vision.fullatt_block_indexes {bad} lie outside depth {self.depth}")
        return self

    @property
    def merge_factor(self) -> int:
        """Patches folded into one LLM token by the merger."""
        return self.spatial_merge_size**2

    @property
    def patch_dim(self) -> int:
        """Pixels (times channels) of one flattened input patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def window_patches(self) -> int:
        """Patches inside one attention window (window_size / patch_size squared)."""
        return (self.window_size // self.patch_size) ** 2

    def param_count(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        patch_embed = self.patch_dim * h  # Conv3d without bias
        block = (
            2 * h  # two RMSNorm weights
            + h * 3 * h
            + 3 * h  # fused qkv with bias
            + h * h
            + h  # output projection with bias
            + 3 * h * i
            + 2 * i
            + h  # SwiGLU gate/up/down with biases
        )
        merged = h * self.merge_factor
        merger = h + merged * merged + merged + merged * self.out_hidden_size + self.out_hidden_size
        return patch_embed + self.depth * block + merger


class SpecialTokens(Spec):
    """Token ids the processor inserts around visual content (must lie inside the vocab)."""

    image_token_id: int = Field(151655, ge=0, description="Placeholder for one image token.")
    video_token_id: int = Field(151656, ge=0, description="Placeholder for one video token.")
    vision_start_token_id: int = Field(151652, ge=0, description="Marks where visual input starts.")
    vision_end_token_id: int = Field(151653, ge=0, description="Marks where visual input ends.")
    eos_token_id: int = Field(151645, ge=0, description="End of a response.")
    pad_token_id: int = Field(151643, ge=0, description="Padding.")
    bos_token_id: int = Field(151643, ge=0, description="Beginning of text.")


# `model=hub`: the architecture is read from `model.path`'s config.json (conf/model/hub.yaml).
HUB = "hub"


class ModelSpec(Spec):
    """A Qwen2.5-VL model: the LLM decoder plus its vision tower."""

    name: str = Field(..., description="Preset name, e.g. qwen2_5_vl_7b.")
    path: str | None = Field(
        None,
        description="A Hub-format model folder (config.json, safetensors, tokenizer, "
        "processor) to load; None builds random weights from these shapes.",
    )
    hidden_size: int = Field(..., ge=1, description="LLM hidden width.")
    num_layers: int = Field(..., ge=1, description="LLM decoder layers.")
    num_heads: int = Field(..., ge=1, description="LLM query heads.")
    num_kv_heads: int = Field(..., ge=1, description="LLM key/value heads (GQA).")
    intermediate_size: int = Field(..., ge=1, description="LLM SwiGLU width.")
    vocab_size: int = Field(..., ge=1, description="Vocabulary size.")
    tie_word_embeddings: bool = Field(False, description="lm_head shares the embedding matrix.")
    rope_theta: float = Field(1_000_000.0, gt=0, description="RoPE base.")
    mrope_section: tuple[int, int, int] = Field(
        (16, 24, 24), description="M-RoPE split of head_dim/2 into (t, h, w)."
    )
    max_position_embeddings: int = Field(128_000, ge=1, description="Longest position.")
    rms_norm_eps: float = Field(1e-6, gt=0, description="RMSNorm epsilon.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        description="Parameter dtype the plan prices. The torch roles hold the device's "
        "(bfloat16 on CUDA, float32 on CPU): a torch-trained run plans that and refuses a "
        "command-line value they would not hold (jobs/model_dtype.py).",
    )
    vision: VisionSpec = Field(..., description="The vision tower.")
    trainable_vision: bool = Field(
        False, description="Train the vision tower too. Frozen towers let phases share features."
    )
    special_tokens: SpecialTokens = Field(default_factory=SpecialTokens, description="Ids.")

    @model_validator(mode="before")
    @classmethod
    def _from_folder(cls, data: Any) -> Any:
        """`model=hub model.path=<folder>`: every architecture field from the folder's
        config.json (a train checkpoint means its `model/`); `dtype` and
        `trainable_vision` may still be set beside it."""
        if not isinstance(data, dict) or data.get("name") != HUB:
            return data
        import json
        from pathlib import Path

        from rollplex.specs.hub_repo import looks_like_repo_id, repo_config, repo_name

        if not data.get("path"):
            raise ValueError("model=hub needs model.path=<a Hub-format model folder>")
        path, folder = data["path"], Path(data["path"]).expanduser()
        if looks_like_repo_id(path):  # a Hub repo id: the spec keeps it as its path
            config, name = repo_config(path), repo_name(path)
        else:
            if (folder / "trainer_state.json").is_file() and (folder / "model").is_dir():
                folder = folder / "model"
            config, name, path = folder / "config.json", folder.name, str(folder)
        try:
            raw = json.loads(config.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"model.path: cannot read {config}: {err}") from err
        if not isinstance(raw, dict):
            kind = type(raw).__name__
            raise ValueError(f"model.path: {config} holds a JSON {kind}, not an object")
        keep = {k: data[k] for k in ("dtype", "trainable_vision") if k in data}
        return cls.from_hf_config(raw, name=name, path=path, **keep).model_dump()

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        if 2 * sum(self.mrope_section) != self.head_dim:
            raise ValueError(
                f"mrope_section {self.mrope_section} must sum to head_dim/2 = {self.head_dim // 2}"
            )
        for field, tid in self.special_tokens.model_dump().items():
            if tid >= self.vocab_size:
                raise ValueError(
                    f"special_tokens.{field}={tid} lies outside vocab {self.vocab_size}"
                )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of K (or V) for one token: kv heads times head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def dtype_bytes(self) -> int:
        return {"bfloat16": 2, "float16": 2, "float32": 4}[self.dtype]

    def llm_layer_params(self) -> int:
        h, kv, i = self.hidden_size, self.kv_dim, self.intermediate_size
        attn = h * h + h + 2 * (h * kv + kv) + h * h  # q,k,v with bias; o without
        return attn + 3 * h * i + 2 * h

    def llm_param_count(self) -> int:
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + self.num_layers * self.llm_layer_params() + self.hidden_size + head

    def param_count(self) -> int:
        """All parameters: LLM, lm_head (unless tied) and the vision tower."""
        return self.llm_param_count() + self.vision.param_count()

    def trainable_param_count(self) -> int:
        return self.param_count() if self.trainable_vision else self.llm_param_count()

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token keeps across all layers."""
        return 2 * self.num_layers * self.kv_dim * self.dtype_bytes

    def hf_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `Qwen2_5_VLConfig` (computed fresh: specs are copied with
        `model_copy(update=...)`, which would carry a cached value over stale)."""
        st = self.special_tokens
        text = dict(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_scaling={"type": "mrope", "mrope_section": list(self.mrope_section)},
            eos_token_id=st.eos_token_id,
            pad_token_id=st.pad_token_id,
            bos_token_id=st.bos_token_id,
        )
        v = self.vision
        vision = dict(
            depth=v.depth,
            hidden_size=v.hidden_size,
            num_heads=v.num_heads,
            intermediate_size=v.intermediate_size,
            out_hidden_size=v.out_hidden_size,
            patch_size=v.patch_size,
            temporal_patch_size=v.temporal_patch_size,
            spatial_merge_size=v.spatial_merge_size,
            window_size=v.window_size,
            fullatt_block_indexes=list(v.fullatt_block_indexes),
            in_channels=v.in_channels,
        )
        return dict(
            text_config=text,
            vision_config=vision,
            tie_word_embeddings=self.tie_word_embeddings,
            image_token_id=st.image_token_id,
            video_token_id=st.video_token_id,
            vision_start_token_id=st.vision_start_token_id,
            vision_end_token_id=st.vision_end_token_id,
        )

    def arch_diff(self, other: ModelSpec) -> dict[str, tuple[Any, Any]]:
        """Fields that differ between two specs' architectures (dotted names, e.g.
        'vision.depth' -> (ours, theirs)); the name, path, dtype and training choices are
        not architecture and are skipped."""
        a, b = _flat(self.model_dump(mode="json")), _flat(other.model_dump(mode="json"))
        return {
            k: (a.get(k), b.get(k))
            for k in sorted(set(a) | set(b))
            if k.split(".")[0] not in _NOT_ARCH and a.get(k) != b.get(k)
        }

    @classmethod
    def from_hf_config(
        cls, config: Any, name: str, path: str | None = None, **overrides: Any
    ) -> ModelSpec:
        """The spec of a transformers `Qwen2_5_VLConfig` (or its dict, as in config.json).
        `overrides` set the fields a config does not hold (trainable_vision) or replace
        read ones (dtype). Raises ValueError (pydantic's) when the numbers are inconsistent."""
        from transformers import Qwen2_5_VLConfig

        if isinstance(config, dict):
            config = Qwen2_5_VLConfig.from_dict(config)
        text, vision = config.text_config, config.vision_config
        rope = dict(getattr(text, "rope_parameters", None) or {})

        def first(x: Any) -> Any:  # eos may be a list in Hub configs
            return x[0] if isinstance(x, list | tuple) else x

        bos = first(getattr(text, "bos_token_id", None))
        tokens = {
            "image_token_id": config.image_token_id,
            "video_token_id": config.video_token_id,
            "vision_start_token_id": config.vision_start_token_id,
            "vision_end_token_id": config.vision_end_token_id,
            "eos_token_id": first(getattr(text, "eos_token_id", None)),
            "bos_token_id": bos,
            # Qwen's pad is <|endoftext|>, the bos id; Hub configs often leave it out.
            "pad_token_id": first(getattr(text, "pad_token_id", None)),
        }
        if tokens["pad_token_id"] is None:
            tokens["pad_token_id"] = bos
        dtype = getattr(config, "dtype", None) or getattr(text, "dtype", None)
        dtype = str(dtype).removeprefix("torch.") if dtype is not None else "bfloat16"
        fields: dict[str, Any] = dict(
            name=name,
            path=path,
            hidden_size=text.hidden_size,
            num_layers=text.num_hidden_layers,
            num_heads=text.num_attention_heads,
            num_kv_heads=text.num_key_value_heads,
            intermediate_size=text.intermediate_size,
            vocab_size=text.vocab_size,
            tie_word_embeddings=bool(config.tie_word_embeddings),
            rope_theta=rope.get("rope_theta", getattr(text, "rope_theta", 1_000_000.0)),
            mrope_section=tuple(rope.get("mrope_section") or (16, 24, 24)),
            max_position_embeddings=text.max_position_embeddings,
            rms_norm_eps=text.rms_norm_eps,
            dtype=dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16",
            vision=VisionSpec(
                depth=vision.depth,
                hidden_size=vision.hidden_size,
                num_heads=vision.num_heads,
                intermediate_size=vision.intermediate_size,
                out_hidden_size=vision.out_hidden_size,
                patch_size=vision.patch_size,
                temporal_patch_size=vision.temporal_patch_size,
                spatial_merge_size=vision.spatial_merge_size,
                window_size=vision.window_size,
                fullatt_block_indexes=tuple(vision.fullatt_block_indexes),
                in_channels=vision.in_channels,
            ),
            special_tokens=SpecialTokens(**{k: v for k, v in tokens.items() if v is not None}),
        )
        return cls(**(fields | overrides))

    def to_hf_config(self) -> Any:
        """The transformers `Qwen2_5_VLConfig` with these shapes (imports transformers lazily)."""
        from transformers import Qwen2_5_VLConfig

        return Qwen2_5_VLConfig(**self.hf_kwargs())


# Fields that say how a model is used, not what it is (skipped by ModelSpec.arch_diff).
_NOT_ARCH = frozenset({"name", "path", "dtype", "trainable_vision"})


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _qwen(
    name: str, h: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool = False
) -> ModelSpec:
    return ModelSpec(
        name=name,
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        vision=VisionSpec(out_hidden_size=h),
    )


def _tiny() -> ModelSpec:
    # head_dim 32 keeps it usable by vLLM's CPU attention; ids sit inside the tiny vocab.
    # Vocab 64 fits the task's 26 tokens, and a random policy hits a one-token answer at
    # ~1/64, often enough for GRPO to learn from (rollplex.backends.torch.task).
    return ModelSpec(
        name="tiny",
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=256,
        vocab_size=64,
        tie_word_embeddings=False,
        mrope_section=(4, 6, 6),
        max_position_embeddings=4096,
        dtype="float32",
        vision=VisionSpec(
            depth=2,
            hidden_size=64,
            num_heads=2,
            intermediate_size=128,
            out_hidden_size=128,
            fullatt_block_indexes=(1,),
        ),
        special_tokens=SpecialTokens(
            image_token_id=5,
            video_token_id=6,
            vision_start_token_id=3,
            vision_end_token_id=4,
            eos_token_id=2,
            pad_token_id=0,
            bos_token_id=1,
        ),
    )


MODEL_PRESETS: dict[str, ModelSpec] = {
    "qwen2_5_vl_3b": _qwen("qwen2_5_vl_3b", 2048, 36, 16, 2, 11008, 151936, tied=True),
    "qwen2_5_vl_7b": _qwen("qwen2_5_vl_7b", 3584, 28, 28, 4, 18944, 152064),
    "qwen2_5_vl_32b": _qwen("qwen2_5_vl_32b", 5120, 64, 40, 8, 27648, 152064),
    "qwen2_5_vl_72b": _qwen("qwen2_5_vl_72b", 8192, 80, 64, 8, 29568, 152064),
    "tiny": _tiny(),
}
