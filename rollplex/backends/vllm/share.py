"""One weight storage for the vLLM engine and the torch trainer (`backend.vllm.weights=share`).

At rollout TP 1 every trainer parameter whose rows form a contiguous run of a vLLM tensor
becomes a view of it (checked value by value first; an unknown layout is refused by name), so
an optimizer step is what the next rollout reads. CUDA only (vLLM's CPU backend repacks its
weights); the engine never sleeps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from rollplex.backends.base import BackendError
from rollplex.specs.model import ModelSpec
from rollplex.weights.layouts import rollout_blocks
from rollplex.weights.params import param_table, rollout_tensors

log = logging.getLogger(__name__)
ON_CPU = (
    "backend.vllm.weights=share needs vLLM on CUDA: its CPU backend repacks linear weights "
    "into its own GEMM format, so they cannot be the trainer's; use backend.vllm.weights=load"
)


@dataclass(slots=True, frozen=True)
class Alias:
    """Parameter `param` is rows [row0, row0 + rows) of vLLM's `tensor` (as a 2-D view)."""

    param: str
    tensor: str
    row0: int
    rows: int


@dataclass(slots=True, frozen=True)
class AliasPlan:
    aliases: tuple[Alias, ...]
    rebuilt: tuple[str, ...]  # vLLM tensors loaded in place at each sync
    rebuilt_params: tuple[str, ...]  # the transformers parameters those are loaded from


def alias_plan(spec: ModelSpec) -> AliasPlan:
    """Where each parameter lies in vLLM's tensors at rollout TP 1 (torch-free)."""
    params = {p.name: p for p in param_table(spec)}
    aliases: list[Alias] = []
    rebuilt: list[str] = []
    rebuilt_params: list[str] = []
    for t in rollout_tensors(spec, vision_tp=True):
        row, whole = 0, True
        for b in rollout_blocks(t, 0, 1, f"{t.name} [vLLM TP 1]"):
            if b.param is not None:
                p = params[b.param]
                if (b.r0, b.r1, b.c0, b.c1) == (0, p.rows, 0, p.cols):
                    aliases.append(Alias(b.param, t.name, row, p.rows))
                else:
                    whole = False
            row += b.r1 - b.r0
        if not whole:
            rebuilt.append(t.name)
            rebuilt_params.extend(p for p in t.params if p not in rebuilt_params)
    return AliasPlan(tuple(aliases), tuple(rebuilt), tuple(rebuilt_params))


def _view(tensor: torch.Tensor, a: Alias, shape: torch.Size) -> torch.Tensor:
    rows = tensor.detach().view(tensor.shape[0], -1)
    return rows[a.row0 : a.row0 + a.rows].view(shape)


class SharedStorage:
    """The trainer's parameters as views of the engine model's tensors (see the module
    docstring); `sync()` keeps them so after anything replaced a parameter's storage."""

    def __init__(self, engine: torch.nn.Module, trainer: torch.nn.Module, spec: ModelSpec):
        self.plan = alias_plan(spec)
        self.trainer = trainer
        theirs = dict(engine.named_parameters())
        mine = dict(trainer.named_parameters())
        self.views: dict[str, torch.Tensor] = {}
        for a in self.plan.aliases:
            if a.tensor not in theirs:
                raise BackendError(
                    f"backend.vllm.weights=share: the engine has no tensor '{a.tensor}' (the "
                    f"algebra's home of '{a.param}'); this vLLM names its parameters "
                    "differently: use backend.vllm.weights=load"
                )
            if a.param not in mine:
                raise BackendError(f"backend.vllm.weights=share: the trainer has no '{a.param}'")
            t, p = theirs[a.tensor], mine[a.param]
            if t.dtype != p.dtype or t.device != p.device or not t.is_contiguous():
                raise BackendError(
                    f"backend.vllm.weights=share: vLLM's '{a.tensor}' is {t.dtype} on "
                    f"{t.device}{'' if t.is_contiguous() else ', not contiguous'}, the "
                    f"trainer's '{a.param}' {p.dtype} on {p.device}: set backend.vllm.dtype "
                    "to the trainer's dtype"
                )
            view = _view(t, a, p.shape)
            if not torch.equal(view, p.detach()):
                raise BackendError(
                    f"backend.vllm.weights=share: rows [{a.row0}, {a.row0 + a.rows}) of "
                    f"vLLM's '{a.tensor}' do not hold '{a.param}': the engine's layout is "
                    "not the one the algebra describes; use backend.vllm.weights=load"
                )
            self.views[a.param] = view
        with torch.no_grad():
            for name, view in self.views.items():
                mine[name].data = view
        self._ptrs = {n: v.data_ptr() for n, v in self.views.items()}
        self.shared_bytes = sum(v.numel() * v.element_size() for v in self.views.values())
        self.rebuilt_bytes = sum(
            mine[n].numel() * mine[n].element_size() for n in self.plan.rebuilt_params
        )
        log.info(
            "vLLM shares the trainer's storage: %d parameters (%.2f GiB) are views of the "
            "engine's tensors; %d tensors (%.2f GiB) rebuilt per sync",
            len(self.views),
            self.shared_bytes / 2**30,
            len(self.plan.rebuilt),
            self.rebuilt_bytes / 2**30,
        )

    def sync(self) -> int:
        """Re-point parameters whose storage was replaced since (copying their values into
        the engine's tensors first); returns how many were."""
        mine = dict(self.trainer.named_parameters())
        moved = [n for n, ptr in self._ptrs.items() if mine[n].data_ptr() != ptr]
        with torch.no_grad():
            for n in moved:
                self.views[n].copy_(mine[n].detach())
                mine[n].data = self.views[n]
        if moved:
            log.warning(
                "vLLM weights=share: %d trainer parameters had left the engine's storage "
                "(e.g. '%s'; moved to host and back?); copied back and re-aliased",
                len(moved),
                moved[0],
            )
        return len(moved)

    def rebuilt_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """(transformers name, tensor) of the parameters the engine loads at each sync."""
        mine = dict(self.trainer.named_parameters())
        return [(n, mine[n].detach()) for n in self.plan.rebuilt_params]
