"""The one pydantic base every user-facing spec derives from."""

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Frozen, strict about unknown fields, validated once on the driver."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
