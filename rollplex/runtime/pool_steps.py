"""The executor's side of a pooled plan (planner/pools.py): which steps this rank issues, and
its part of each transfer step (runtime/transfers.py moves the bytes).

A rank issues its own group's steps and every transfer whose routes name it: trainers send
weight shards and rollout ranks receive them as this step's trained weights; at the hand-over
the rollout sends what later phases read. Every transfer is logged and becomes step metrics.
"""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from rollplex.graph.ir import Graph, ValueKind, version_model
from rollplex.planner.plan import Plan, Step
from rollplex.planner.pools import PoolError, Pools
from rollplex.runtime.transfers import (
    Moved,
    handover_values,
    planned,
    recv_outputs,
    recv_weights,
    send_outputs,
    send_weights,
)

log = logging.getLogger(__name__)


class PoolSteps:
    """The executor's side of a pooled plan: which steps this rank issues, and its part of
    each transfer step. `backend.pool_side` (backends/fsdp/pools.py) gives the shards to
    send, the parameters to fill, this rank's prompt count, and takes the step metrics."""

    def __init__(self, plan: Plan, graph: Graph, pools: Pools, backend: Any) -> None:
        self.pools, self.graph = pools, graph
        self.side = getattr(backend, "pool_side", None)
        if self.side is None:
            raise PoolError(f"{type(backend).__name__} has no pool side: it cannot run pools")
        self.transfers = {t.step: t for t in plan.transfers}
        self.dev_of = {s.index: i for i, d in enumerate(plan.devices) for s in d.steps}
        self.handover = handover_values(graph)
        self.moved: list[Moved] = []  # every transfer this rank took part in, in order
        self.weights_value = ""  # the external weights value the weights transfer fills
        syncs = [op for op in graph if op.kind == "weight_sync"]
        if syncs:
            model = version_model(graph.values[syncs[0].inputs["weights"]].version)
            self.weights_value = next(
                v.name for v in graph.values.values()
                if v.external and v.kind is ValueKind.WEIGHTS and version_model(v.version) == model
            )  # fmt: skip
            self.model = model

    def issues(self, step: Step) -> bool:
        t = self.transfers.get(step.index)
        mine = self.dev_of[step.index] == self.pools.device
        return self.pools.in_transfer(t) if t is not None else mine

    def sends(self, step: Step) -> list[str]:
        """The values this rank's side of transfer `step` reads from its environment."""
        t = self.transfers[step.index]
        if t.what == "weights" or not any(r.src == self.pools.rank for r in t.routes):
            return []
        return list(self.handover)

    def run(self, step: Step, env: Any) -> tuple[dict[str, str], str]:
        t, rank = self.transfers[step.index], self.pools.rank
        sends = any(r.src == rank for r in t.routes)
        reads: dict[str, str] = {}
        if t.what == "weights":
            if sends:
                shards, version = self.side.weight_shards()
                m = send_weights(self.pools, t, shards, version, step.name)
            else:
                version, m = recv_weights(self.pools, t, self.side.weight_params(), step.name)
                env.device[self.weights_value] = self.side.weights_received(version)
            reads = {"weights": f"{self.model}@{version}"}
        elif sends:
            values = {v: env.device.get(v) for v in self.handover}
            total = self.side.local_prompts() * len(self.pools.pool_ranks("rollout"))
            m = send_outputs(self.pools, t, values, total, step.name)
        else:
            got, m = recv_outputs(self.pools, t, self.side.device, step.name)
            env.device.update(got)
        self.moved.append(m)
        key = "weights" if t.what == "weights" else "outputs"
        self.side.record(
            {f"transfer/{key}_bytes": m.nbytes, f"transfer/{key}_s": m.seconds} if not sends else {}
        )
        plan = {k: n for k, n in planned(t).items() if rank in k}
        note = (f"{'sent' if sends else 'received'} {t.what}: {m.nbytes} bytes in "
                f"{m.seconds:.4f} s, routes {m.routes} (plan {plan})"
                + (f"; by value {m.values}" if m.values else ""))  # fmt: skip
        log.debug("rank %d, '%s': %s", rank, step.name, note)  # every step: --verbose
        return reads, note

    def sync_weights(self) -> None:
        """The weights transfer out of plan (every rank calls it: e.g. before a rollout
        rank evaluates the latest update)."""
        t = next((t for t in self.transfers.values() if t.what == "weights"), None)
        if t is None or not self.pools.in_transfer(t):
            return
        if any(r.src == self.pools.rank for r in t.routes):
            shards, version = self.side.weight_shards()
            send_weights(self.pools, t, shards, version, "sync")
        else:
            version, m = recv_weights(self.pools, t, self.side.weight_params(), "sync")
            self.side.weights_received(version)
            log.info(
                "rank %d: %s@%d received out of plan (%d bytes, %.4f s)",
                self.pools.rank, self.model, version, m.nbytes, m.seconds,
            )  # fmt: skip

    def report(self) -> dict[str, Any]:
        """Per transfer step, over all ranks (a collective: every rank calls it): the
        planned and the measured bytes per route (`"src->dst"`) of the last RL step, the
        hand-over's bytes per graph value, and the medians over RL steps of the slowest
        sender's and the slowest receiver's seconds (a receiver's include its wait for
        the sender: the pools run one after the other)."""
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, self.moved)
        out: dict[str, Any] = {}
        for _, t in sorted(self.transfers.items()):
            runs = {
                rank: [m for m in ms if m.what == t.what and m.step != "sync"]
                for rank, ms in enumerate(every)
            }
            runs = {rank: r for rank, r in runs.items() if r}
            if not runs:
                continue
            steps = min(len(r) for r in runs.values())
            last = [r[steps - 1] for r in runs.values()]
            measured = {k: n for m in last for k, n in m.routes.items()}
            by_value: dict[str, int] = {}
            for m in last:
                for k, n in m.values.items():
                    by_value[k] = by_value.get(k, 0) + n
            senders = {r.src for r in t.routes}

            def median(side: bool, runs=runs, steps=steps, senders=senders) -> float:
                xs = sorted(
                    max(r[i].seconds for rank, r in runs.items() if (rank in senders) == side)
                    for i in range(steps)
                )
                return xs[len(xs) // 2]

            out[last[0].step] = {
                "what": t.what,
                "planned": {f"{a}->{b}": n for (a, b), n in planned(t).items()},
                "measured": {f"{a}->{b}": n for (a, b), n in sorted(measured.items())},
                "planned_bytes": t.nbytes,
                "measured_bytes": sum(measured.values()),
                "by_value": by_value,
                "send_s": median(True),
                "recv_s": median(False),
                "steps": steps,
            }
        return out
