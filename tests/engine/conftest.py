"""The torch backend's fixtures (tiny spec, seeded model, 2-prompt batch, its prefix), shared."""

from __future__ import annotations

from tests.backends.torch.conftest import (  # noqa: F401 (fixtures)
    _deterministic,
    batch,
    model,
    prefix,
    processor,
    spec,
    tokenizer,
)
