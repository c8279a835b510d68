"""The parameter dtype a run's torch roles hold, which is the dtype its plan prices.

The torch roles load every model in the device's dtype (models/io.py `default_dtype`:
bfloat16 on CUDA, beside float32 masters for AdamW; float32 elsewhere), whatever
`model.dtype`, a preset or a folder's config.json says. So a torch-trained run plans that
dtype, and a `model.dtype=` given on the command line that those roles would not hold is
refused by name. The FSDP2 trainer casts as `backend.fsdp` says, and is left as it is.
"""

from __future__ import annotations

from rollplex.models.io import default_dtype_name
from rollplex.specs import ModelSpec
from rollplex.specs.run import RunSpec


def held_dtype(spec: RunSpec) -> str | None:
    """The dtype the run's torch roles hold their parameters in; None under FSDP2."""
    if spec.backend.trainer != "torch":
        return None
    return default_dtype_name(spec.train.device.split(":")[0])


def dtype_refusal(spec: RunSpec, keys: frozenset[str] | None) -> str | None:
    """Why the command line's `model.dtype` cannot be honoured, or None."""
    held = held_dtype(spec)
    # the key itself: choosing a model group (`model=hub`) takes its dtype, not a choice
    if keys is None or held is None or "model.dtype" not in keys or spec.model.dtype == held:
        return None
    return (
        f"model.dtype={spec.model.dtype}: the torch roles hold {held} parameters on "
        f"train.device={spec.train.device} (bfloat16 with float32 AdamW masters on CUDA, "
        "float32 on CPU); leave model.dtype unset"
    )


def as_held(model: ModelSpec, spec: RunSpec) -> tuple[ModelSpec, str | None]:
    """(`model` in the dtype the run holds it in, the log line saying so where that is not
    the dtype it came with)."""
    held = held_dtype(spec)
    if held is None or model.dtype == held:
        return model, None
    note = (
        f"model.dtype={model.dtype} (as its folder or preset says) is planned as {held}: the "
        f"torch roles hold {held} parameters on train.device={spec.train.device}"
    )
    return model.model_copy(update={"dtype": held}), note
