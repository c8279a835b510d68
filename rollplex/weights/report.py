"""Totals of a WeightSharing: per parameter class and per GPU, as tables and a summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rollplex.weights.sharing import Kind, WeightSharing

GIB = 1 << 30


@dataclass(slots=True)
class Tally:
    """Bytes of a set of rollout tensors on one GPU (or summed over GPUs)."""

    full: int = 0  # the rollout copy: what a second full copy costs
    shared: int = 0  # identical + view + the in-place part of partial
    local: int = 0  # held by local training storage (shared or copied locally)
    remote: int = 0  # must come from other GPUs when rebuilt
    sync: int = 0  # rebuilt bytes of trainable tensors: redone after every optimizer step
    kinds: Counter = field(default_factory=Counter)  # (kind -> tensors)

    @property
    def rebuild(self) -> int:
        return self.full - self.shared

    def add(self, other: Tally) -> None:
        self.full += other.full
        self.shared += other.shared
        self.local += other.local
        self.remote += other.remote
        self.sync += other.sync
        self.kinds.update(other.kinds)


@dataclass(slots=True)
class SharingReport:
    sharing: WeightSharing
    per_gpu: list[Tally]  # index = GPU
    per_class: dict[str, Tally]  # summed over GPUs

    @property
    def world(self) -> int:
        return len(self.per_gpu)

    def summary(self) -> dict[str, Any]:
        s, full = self.sharing, sum(t.full for t in self.per_gpu)
        return {
            "model": s.spec.name,
            "layouts": s.layouts,
            "rank_map": s.rank_map,
            "replicas": [list(r) for r in s.rollout.replicas],
            "gpus": self.world,
            "param_bytes": s.param_bytes(),
            "shared_fraction": sum(t.shared for t in self.per_gpu) / full,
            "full_copy_bytes_per_gpu": max(t.full for t in self.per_gpu),
            "shared_bytes_per_gpu": min(t.shared for t in self.per_gpu),
            "rebuild_bytes_per_gpu": max(t.rebuild for t in self.per_gpu),
            "saved_bytes_per_gpu": min(t.shared for t in self.per_gpu),
            "remote_bytes_per_gpu": max(t.remote for t in self.per_gpu),
            "sync_bytes_per_step_per_gpu": max(t.sync for t in self.per_gpu),
            "train_bytes_per_gpu": max(s.train_bytes(g) for g in range(self.world)),
            "kinds": {k.value: sum(t.kinds[k] for t in self.per_gpu) for k in Kind},
        }


def tally(sharing: WeightSharing) -> SharingReport:
    """Every rollout tensor on every GPU, added up (one evaluation per parameter class:
    the layers of a class have equal shapes)."""
    per_gpu, per_class = [], {}
    for g in range(sharing.world):
        gpu = Tally()
        for sh, n in sharing.class_shares(g):
            t = Tally(
                full=sh.nbytes * n,
                shared=sh.shared_bytes * n,
                local=sh.local_bytes * n,
                remote=sh.remote_bytes * n,
                sync=sh.rebuild_bytes * n if sh.trainable else 0,
                kinds=Counter({sh.kind: n}),
            )
            gpu.add(t)
            per_class.setdefault(sh.group, Tally()).add(t)
        per_gpu.append(gpu)
    return SharingReport(sharing, per_gpu, per_class)


def _gib(n: float) -> str:
    return f"{n / GIB:.3f}"


def _kinds(c: Counter, world: int) -> str:
    return ", ".join(f"{k.value} {c[k] / world:g}" for k in Kind if c[k])


def class_table(report: SharingReport) -> str:
    """Markdown: per parameter class, the mean per GPU (GiB) and the classes' mix."""
    w = report.world
    lines = [
        "| parameter class | tensors/GPU by kind | full copy | shared | rebuilt "
        "| from other GPUs |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, t in report.per_class.items():
        lines.append(
            f"| {name} | {_kinds(t.kinds, w)} | {_gib(t.full / w)} | {_gib(t.shared / w)} "
            f"| {_gib(t.rebuild / w)} | {_gib(t.remote / w)} |"
        )
    total = Tally()
    for t in report.per_gpu:
        total.add(t)
    lines.append(
        f"| **total (mean/GPU)** | {_kinds(total.kinds, w)} | {_gib(total.full / w)} "
        f"| {_gib(total.shared / w)} | {_gib(total.rebuild / w)} | {_gib(total.remote / w)} |"
    )
    return "\n".join(lines)


def summary_lines(report: SharingReport) -> list[str]:
    s = report.summary()
    return [
        f"{s['model']}: {s['layouts']} (rank map: {s['rank_map']}), {s['gpus']} GPUs",
        f"  shared fraction        {s['shared_fraction']:.2%}",
        f"  full copy per GPU      {_gib(s['full_copy_bytes_per_gpu'])} GiB (max)",
        f"  rebuild buffer per GPU {_gib(s['rebuild_bytes_per_gpu'])} GiB (max)",
        f"  saved per GPU          {_gib(s['saved_bytes_per_gpu'])} GiB (min) "
        "against a full second copy",
        f"  from other GPUs        {_gib(s['remote_bytes_per_gpu'])} GiB per rebuild (max)",
        f"  re-synced per step     {_gib(s['sync_bytes_per_step_per_gpu'])} GiB "
        "(trainable tensors; frozen ones are rebuilt once)",
    ]
