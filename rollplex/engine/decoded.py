"""What a decode keeps for the training response forward (decode once).

On-policy, decode step t runs every decoder layer over response token t with the weights
the training forward reads. With checkpointed layers its backward needs only each layer's
input per response token and the final norm's input, so the decode keeps each layer's output
(`Workspace.kept`, written in the step itself) and the trainer replays them
(backends/torch/decoded_response.py). The export is a view of the workspace, valid until
the engine starts another decode there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(slots=True)
class DecodedOutputs:
    """Layer outputs [layers, rows, steps, H] of one decode's fed tokens, rows prompt-major
    as its responses; column j is response token j's (tokens 0 .. R-2: the last is never
    fed). `version` is the weights version that decoded (set by the role)."""

    workspace: Any  # engine.workspace.Workspace (not imported: it imports this module's users)
    generation: int  # the workspace's decode these came from
    rows: int
    version: str = ""

    def layers(self) -> torch.Tensor:
        ws = self.workspace
        if ws is None:
            raise RuntimeError("the decode's kept outputs were already released")
        if ws.generation != self.generation or ws.kept is None:
            raise RuntimeError(
                "the decode engine started another decode in these buffers: the kept "
                "outputs of this one are gone (decode once needs them before the next decode)"
            )
        return ws.kept[:, : self.rows]

    def tensors(self) -> Iterator[torch.Tensor]:
        if self.workspace is not None:
            yield self.layers()

    def release(self) -> None:
        """The plan lets it go after the backward (the buffer stays the workspace's)."""
        self.workspace = None
