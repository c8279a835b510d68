"""Float32 master weights for a bf16/fp16 model's trained parameters.

At RL learning rates an update rounds away in bf16, so AdamW and clipping run on float32
masters (12 bytes a parameter, as the planner prices it): `clipped_step` moves the
micro-batches' gradients onto them a chunk at a time, and `copy_to_params` rounds the
result back into the parameters in place, because the rollout and the decode engine alias
their storage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rollplex.backends.base import BackendError
from rollplex.ops.formulas.training import MASTER_STEP_CHUNK_BYTES  # priced there

LOW_PRECISION = (torch.bfloat16, torch.float16)


class StateMismatch(BackendError):
    """A trainer state that does not fit this trainer; `part` says which ("masters" or
    "optimizer"), so a checkpoint can name its file."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(f"{part}: {message}")
        self.part = part


@dataclass(slots=True, eq=False)
class Masters:
    """The trained parameters and what AdamW updates for each: a float32 master for a
    low-precision parameter, the parameter itself for a float32 one."""

    names: tuple[str, ...]
    params: tuple[nn.Parameter, ...]
    tensors: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, named: Sequence[tuple[str, nn.Parameter]]) -> Masters | None:
        """Masters for the low-precision ones of `named`; None when there are none."""
        if not any(p.dtype in LOW_PRECISION for _, p in named):
            return None
        tensors = tuple(
            p.detach().to(torch.float32, copy=True) if p.dtype in LOW_PRECISION else p
            for _, p in named
        )
        return cls(tuple(n for n, _ in named), tuple(p for _, p in named), tensors)

    def separate(self) -> Iterator[tuple[str, nn.Parameter, torch.Tensor]]:
        """(name, parameter, master) for each parameter with a master of its own."""
        for n, p, m in zip(self.names, self.params, self.tensors, strict=True):
            if m is not p:
                yield n, p, m

    @torch.no_grad()
    def copy_to_params(self) -> None:
        for _, p, m in self.separate():
            p.data.copy_(m)  # in place: aliases of the parameter stay valid

    @torch.no_grad()
    def assign(self, values: Mapping[str, torch.Tensor]) -> None:
        """Masters from `values` (by name; float32 loaded weights keep their precision),
        then the parameters rounded from them."""
        for n, _, m in self.separate():
            m.copy_(values[n])
        self.copy_to_params()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: m.detach().cpu().contiguous() for n, _, m in self.separate()}

    @staticmethod
    def check(
        saved: Mapping[str, Any], ours: Masters | None, trained: Sequence[tuple[str, nn.Parameter]]
    ) -> None:
        """StateMismatch("masters") unless `saved` holds a float32 tensor of the right shape
        for exactly the parameters that keep masters (all trained ones for a float32
        trainer), each rounding to the parameter's current (just loaded) value."""
        params = dict(trained)
        wanted = {n for n, _, _ in ours.separate()} if ours is not None else set(params)
        if missing := sorted(wanted - set(saved)):
            raise StateMismatch("masters", f"no master for {_few(missing)}")
        if extra := sorted(set(saved) - wanted):
            raise StateMismatch("masters", f"masters of no trained parameter: {_few(extra)}")
        for n in sorted(wanted):
            m, p = saved[n], params[n]
            if not isinstance(m, torch.Tensor) or m.dtype != torch.float32:
                raise StateMismatch("masters", f"{n}: not a float32 tensor")
            if m.shape != p.shape:
                raise StateMismatch(
                    "masters", f"{n}: shape {tuple(m.shape)}, the parameter's {tuple(p.shape)}"
                )
            if ours is not None and not torch.equal(m.to(p.device, p.dtype), p.detach()):
                raise StateMismatch(
                    "masters", f"{n}: does not round to the checkpoint's weights (another step's?)"
                )

    @staticmethod
    @torch.no_grad()
    def load(
        saved: Mapping[str, torch.Tensor],
        ours: Masters | None,
        trained: Sequence[tuple[str, nn.Parameter]],
    ) -> None:
        """Checked masters into ours, or into a float32 model's parameters."""
        if ours is not None:
            ours.assign(saved)
        else:
            for n, p in trained:
                p.copy_(saved[n])


def own_masters(masters: Masters | None) -> tuple[torch.Tensor, ...]:
    """The masters that are tensors of their own (none for a float32 model): optimizer
    state, offloaded and onloaded with the moments (`OptimizerHandle`)."""
    return () if masters is None else tuple(m for _, _, m in masters.separate())


def adamw_over(
    named: Sequence[tuple[str, nn.Parameter]], **adamw: Any
) -> tuple[Masters | None, torch.optim.AdamW]:
    """AdamW over `named`'s masters when some are low-precision (else over the parameters
    themselves, masters None): the policy's and the critic's optimizer.

    Fused (one kernel over the tensor lists, updating in place) on every device: torch's
    CUDA default, foreach, allocates a float32 temporary the size of all the parameters at
    the step (`_foreach_sqrt` of the second moments), 28 GiB at the 7B shape, which is what
    kept its full fine-tuning off one H200; the planner prices the fused step's scratch
    (`ops.formulas.optimizer_step`)."""
    masters = Masters.of(named)
    params = masters.tensors if masters else [p for _, p in named]
    return masters, torch.optim.AdamW(params, fused=True, **adamw)


def clear_grads(
    optimizer: torch.optim.Optimizer, masters: Masters | None, params: Sequence[nn.Parameter]
) -> None:
    """Before a backward: the optimizer's grads, and with masters the parameters' own (where
    the micro-batches accumulate)."""
    optimizer.zero_grad(set_to_none=True)
    if masters is not None:
        for p in params:
            p.grad = None


def clipped_step(
    optimizer: torch.optim.Optimizer,
    masters: Masters | None,
    params: Sequence[nn.Parameter],
    max_norm: float,
) -> None:
    """Clip to `max_norm` and step; with masters, on the float32 casts of the parameters'
    grads, then the rounded masters copied back into the parameters in place.

    With masters the casts are made a chunk at a time (`MASTER_STEP_CHUNK_BYTES`): the norm
    of each gradient in float32 (`vector_norm(dtype=float32)`, the cast's values without
    keeping a cast), then per chunk the casts clipped and stepped, so the step
    never holds every gradient in float32 (2 B a parameter more than in bf16, 14 GiB at
    7B, at the step's memory peak). The result is `clip_grad_norm_(foreach=False)` then
    one AdamW step over all of them: the update is elementwise, and AdamW skips a
    parameter whose grad is None."""
    if masters is None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return
    pairs = [
        (p, m) for p, m in zip(masters.params, masters.tensors, strict=True) if p.grad is not None
    ]
    if pairs:
        device = pairs[0][1].device
        norms = [_norm(p.grad).to(device) for p, _ in pairs]
        total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for chunk in _chunks(pairs, MASTER_STEP_CHUNK_BYTES):
            for p, m in chunk:
                grad = _cast(p, m)
                if m is not p:
                    p.grad = None  # its narrower gradient goes as its cast is made
                m.grad = grad.mul_(coef.to(grad.device))
            optimizer.step()  # this chunk's masters: every other grad is None
            for _, m in chunk:
                m.grad = None
    for p in params:
        p.grad = None
    masters.copy_to_params()


def _norm(grad: torch.Tensor) -> torch.Tensor:
    """The float32 L2 norm of a gradient, computed in float32 without a float32 copy."""
    return torch.linalg.vector_norm(grad, 2.0, dtype=torch.float32)


def _cast(p: nn.Parameter, m: torch.Tensor) -> torch.Tensor:
    """The float32 gradient of master `m`: a new cast of the parameter's, or a float32
    parameter's own (then `m` is `p`)."""
    return p.grad if m is p else p.grad.to(m.device, torch.float32)


def _chunks(
    pairs: list[tuple[nn.Parameter, torch.Tensor]], limit: int
) -> Iterator[list[tuple[nn.Parameter, torch.Tensor]]]:
    """Consecutive runs of `pairs` whose masters hold at most `limit` bytes (at least one
    each)."""
    chunk: list[tuple[nn.Parameter, torch.Tensor]] = []
    size = 0
    for p, m in pairs:
        nbytes = m.numel() * 4
        if chunk and size + nbytes > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append((p, m))
        size += nbytes
    if chunk:
        yield chunk


def check_optimizer_state(
    state: Mapping[str, Any], optimizer: torch.optim.Optimizer, names: Sequence[str]
) -> None:
    """StateMismatch("optimizer") for per-parameter state of a shape other than its
    parameter's (torch's load_state_dict checks only the counts)."""
    flat = [p for g in optimizer.param_groups for p in g["params"]]
    for idx, st in state.get("state", {}).items():
        if not isinstance(idx, int) or not 0 <= idx < len(flat):
            raise StateMismatch("optimizer", f"state for parameter {idx!r} of {len(flat)}")
        for key, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape != flat[idx].shape:
                raise StateMismatch(
                    "optimizer",
                    f"{names[idx]}: {key!r} has shape {tuple(v.shape)}, the parameter "
                    f"{tuple(flat[idx].shape)}",
                )


def _few(names: Sequence[str], k: int = 3) -> str:
    more = f" and {len(names) - k} more" if len(names) > k else ""
    return ", ".join(names[:k]) + more
