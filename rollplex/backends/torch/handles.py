"""Handles on in-place state the executor's environment names by version: a model's
weights, the optimizer state, the gradients. Each carries a version or a release hook, so
the runtime can check what an op read and really free or move what the plan frees or moves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from rollplex.backends.base import BackendError, version_name
from rollplex.backends.torch.host_memory import move


class VersionCounter:
    """The version a set of parameters holds now; in-place updates bump it."""

    __slots__ = ("n",)

    def __init__(self, n: int = 0) -> None:
        self.n = n


@dataclass(slots=True, eq=False)
class WeightsHandle:
    """One graph weights value: the parameters of `model` as of `version`. The module is
    updated in place, so a handle whose version is behind the counter reads weights that
    are no longer the ones it names: `check` refuses that."""

    model: str  # "policy", "ref", "vision"
    module: nn.Module  # what runs the forward
    params: tuple[nn.Parameter, ...]  # the part this value names
    version: int
    live: VersionCounter

    @property
    def name(self) -> str:
        return version_name(self.model, self.version)

    def check(self, op: str) -> str:
        if self.version != self.live.n:
            raise BackendError(
                f"op '{op}' reads {self.name}, but the parameters were updated in place to "
                f"{version_name(self.model, self.live.n)}: it would read the wrong weights"
            )
        return self.name

    def tensors(self) -> Iterator[torch.Tensor]:
        return iter(self.params)

    def move_to(self, device: torch.device | str) -> WeightsHandle:
        # Tagged with the version the parameters hold now: an offload at the version of
        # the last one (frozen weights, every step) finds its host copy current.
        tag = (self.model, self.live.n)
        for p in self.params:  # in place: every alias of these parameters moves with them
            p.data = move(p.data, device, p, tag=tag)
        return self


@dataclass(slots=True, eq=False)
class OptimizerHandle:
    """The optimizer state the plan calls `<model>.adam`: the moments and, for a bf16/fp16
    model, the float32 master weights (the planner prices both: 12 bytes a parameter)."""

    optimizer: torch.optim.Optimizer
    masters: tuple[torch.Tensor, ...] = ()
    MOVES_IN_PART: ClassVar[bool] = True  # move_to takes a share (rows.TorchValues.move)

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.masters
        for st in self.optimizer.state.values():
            yield from (v for v in st.values() if isinstance(v, torch.Tensor))

    def move_to(self, device: torch.device | str, share: float = 1.0) -> OptimizerHandle:
        """Move the state to `device` in place; with `share` < 1 only its first tensors
        (masters, then each parameter's moments, in the optimizer's order) that hold that
        share of its bytes: an offload and its onload pick the same ones, since the
        optimizer step, which makes AdamW's state, comes after both."""
        parts = list(self._parts())
        total, moved = sum(t.nbytes for t, _ in parts), 0
        for t, put in parts:
            if share < 1 and moved >= share * total:
                break
            moved += t.nbytes
            put(t, device)
        return self

    def _parts(self) -> Iterator[tuple[torch.Tensor, Callable[[torch.Tensor, Any], None]]]:
        """Each tensor of the state, and how to move it in place."""
        for m in self.masters:  # in place: the optimizer keys its state by these tensors

            def put_master(t: torch.Tensor, device: Any, m: torch.Tensor = m) -> None:
                m.data = move(t, device, m)

            yield m.data, put_master
        for param, st in self.optimizer.state.items():
            for k, v in st.items():
                # Adam's `step` counter stays where torch keeps it (a scalar).
                if isinstance(v, torch.Tensor) and v.dim() > 0:

                    def put(t: torch.Tensor, device: Any, st=st, k=k, param=param) -> None:
                        st[k] = move(t, device, param, k)

                    yield v, put


@dataclass(slots=True, eq=False)
class GradsHandle:
    """The gradients backward left on the parameters; `release` frees them."""

    params: tuple[nn.Parameter, ...]

    def tensors(self) -> Iterator[torch.Tensor]:
        return (p.grad for p in self.params if p.grad is not None)

    def release(self) -> None:
        for p in self.params:
            p.grad = None

    def move_to(self, device: torch.device | str) -> GradsHandle:
        for p in self.params:
            if p.grad is not None:
                p.grad = move(p.grad, device, p, "grad")
        return self
