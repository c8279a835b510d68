"""The executor: applies a Plan to a backend, one RL step at a time. It decides nothing.

Per RL step it loads the external values where the plan has them, issues the steps in plan
order (ops and chunks through the backend, offload/onload/transfer steps as copies), applies
the planned frees right after each step, and accounts resident bytes and weight versions.
Where it cannot follow the plan it says so: docs/architecture.md (Runtime).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch.profiler import record_function

from rollplex.backends.base import Backend, Chunk
from rollplex.graph.ir import Graph, ValueKind
from rollplex.planner.plan import CoRun, Plan, Step
from rollplex.planner.pools import Pools
from rollplex.runtime.accounting import ExecutionError, MemoryLedger, check_versions
from rollplex.runtime.callbacks import Callback, Callbacks
from rollplex.runtime.engine_residency import engine_schedule
from rollplex.runtime.memory import Env, allocator_feed, iter_tensors
from rollplex.runtime.order import plan_order
from rollplex.runtime.plan_effects import COPY_KINDS, plan_effects
from rollplex.runtime.plan_tables import (
    initial_host,
    owned_values,
    persistent_values,
    plan_micro_batches,
    plan_op_micro_batches,
    unmoved_values,
)
from rollplex.runtime.pool_steps import PoolSteps
from rollplex.runtime.record import MeasuredStep, StepResult
from rollplex.runtime.rollout_ops import RAN_ALONE
from rollplex.trace.timeline import MemoryEvent

log = logging.getLogger(__name__)


class Executor:
    def __init__(
        self,
        plan: Plan,
        graph: Graph,
        backend: Backend,
        callbacks: Sequence[Callback] = (),
        device: str | torch.device = "cpu",
        pools: Pools | None = None,
    ) -> None:
        self.plan, self.graph, self.backend = plan, graph, backend
        self.callbacks = Callbacks(callbacks)
        self.device = torch.device(device)
        self.order, order_deviations = plan_order(plan)
        self.dev_of = {s.index: i for i, d in enumerate(plan.devices) for s in d.steps}
        self.pooled = None if pools is None else PoolSteps(plan, graph, pools, backend)
        if self.pooled is not None:  # this rank's group's steps and its transfers only
            mine = self.pooled.issues
            order_deviations = [d for d in order_deviations if mine(d.step)]
            self.order = [s for s in self.order if mine(s)]
        self.notes: list[str] = []
        # issue position -> where the runtime could not follow the plan there, and why
        self.deviations: dict[int, list[str]] = {}
        pos = {s.index: k for k, s in enumerate(self.order)}
        for d in order_deviations:
            self._deviate(pos[d.step.index], d.message())
        for s in self.order:
            if s.kind not in COPY_KINDS and s.op not in graph.ops:
                raise ExecutionError(f"plan step '{s.name}' names op '{s.op}', not in the graph")
        backend.bind(graph)
        self.train_micro_batches = plan_micro_batches(plan)
        recompute = bool(plan.meta.get("train_micro_recompute", False))
        fused = bool(plan.meta.get("train_micro_fused", False))
        backend.train_micro_batches(self.train_micro_batches, recompute, fused)
        backend.op_micro_batches(plan_op_micro_batches(plan))
        backend.pack_responses(bool(plan.meta.get("pack_responses", True)))
        log.info(
            "executor: training forward and backward in %d micro-batch(es) a step, as planned "
            "(schedule.train_micro_tokens%s); metric train_micro_batches is the count run",
            self.train_micro_batches,
            ", each forward again inside the backward: schedule.train_micro_recompute"
            if recompute
            else ", each forward inside the backward: schedule.train_micro_fused"
            if fused
            else "",
        )
        if plan.meta.get("skip_zero_advantage"):
            log.info(
                "executor: groups whose advantages are all 0 run no training forward or "
                "backward (algo.skip_zero_advantage; the plan prices every row); metric "
                "trained_rows is the rows trained"
            )
        self._allocs, self._frees = self._effects()
        self._engine = engine_schedule(plan, self.order)
        self._owned = owned_values(plan, graph, self.order, self.dev_of)
        self._start_on_host = initial_host(graph, self.order)
        # value -> the share of it the plan's copies move (optimizer state moved in part)
        self._shares = {s.op: s.share for s in self.order if s.kind in ("offload", "onload")}
        self._persistent = persistent_values(graph)
        self._unmoved = unmoved_values(self._persistent, self.order)
        self._placed: dict[str, bool] = {}  # persistent value -> on host at the last step end
        self._carried: dict[str, Any] = {}  # previous RL step's values for previous_step steps
        # the allocator's totals describe one device group: the only one, or this rank's
        one_group = pools is not None or len(plan.devices) == 1
        feed = allocator_feed(device) if one_group else None
        self._ledger = MemoryLedger(len(plan.devices), feed)
        self.origin = time.perf_counter()
        self.cuda = None
        self._closed = False
        self._stream_notes: dict[int, str] = {}  # issue position -> what its stream runs on
        if self.device.type == "cuda":
            from rollplex.runtime.cuda import CudaStreams

            self.cuda = CudaStreams(plan, self.device)
            plain, self._stream_notes = self.cuda.partition_reports(plan, pos)
            for k, msg in plain:
                self._deviate(k, msg)
            self.notes += self._stream_notes.values()  # logged at info below
        deviations = {m for ms in self.deviations.values() for m in ms}
        for note in self.notes:
            if note not in deviations:
                log.info("executor: %s", note)
        for k, msgs in sorted(self.deviations.items()):
            for msg in msgs:
                log.warning("executor: at '%s': %s", self.order[k].name, msg)

    # -- static preparation --------------------------------------------------------------
    def close(self) -> None:
        """Release what the executor holds on the device: its green contexts (SM
        partitions), after their work. Later steps need a new executor."""
        if self.cuda is not None:
            self.cuda.close()
        self._closed = True

    def _deviate(self, k: int, msg: str) -> None:
        self.deviations.setdefault(k, []).append(msg)
        self.notes.append(msg)

    def _effects(self) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
        allocs, frees, moved = plan_effects(self.plan, self.graph, self.order, self.pooled)
        for k, msg in moved:
            self._deviate(k, msg)
        return allocs, frees

    # -- one RL step ---------------------------------------------------------------------
    def run_step(self, rl_step: int, inputs: Any) -> StepResult:
        if self._closed:
            raise ExecutionError("the executor is closed (its green contexts are retired)")
        with record_function(f"ProfilerStep#{rl_step}"):  # a step of the measured trace
            start = self._now()
            env = Env(shares=self._shares)
            self._place(env, self.backend.begin_step(rl_step, inputs))
            if self.cuda is not None:
                self.cuda.begin(start)
            measured: list[MeasuredStep] = []
            memory: list[MemoryEvent] = []
            for dev in self._ledger_devices():  # what is resident before any op
                memory += self._ledger.resident(env, self._owned[dev], dev, self._now())
            offsets: dict[str, int] = {}
            for k, step in enumerate(self.order):
                self.callbacks.on_step_start(rl_step, step)
                with record_function(step.name):
                    try:
                        m = self._issue(k, step, env, rl_step, memory)
                    except torch.OutOfMemoryError as err:
                        err.add_note(self._oom_note(step, rl_step))
                        raise
                check_versions(m, offsets)
                measured.append(m)
                self.callbacks.on_step_end(rl_step, m)
            if self.cuda is not None:
                times = self.cuda.finish()
                for m in measured:
                    m.start_s, m.end_s = times.get(m.step.index, (m.start_s, m.end_s))
            metrics = self.backend.end_step()
            self._finish(env)
        peak: dict[int, int] = {}
        for m in measured:
            peak[m.device] = max(peak.get(m.device, 0), m.resident_bytes)
        result = StepResult(
            rl_step, start, self._now(), metrics, measured, memory, peak, list(self.notes),
            allocator_step_peak=self._ledger.step_peak(),
            allocator_run_peak=self._ledger.run_peak(),
        )  # fmt: skip
        self.callbacks.on_rl_step_end(result)
        return result

    def _oom_note(self, step: Step, rl_step: int) -> str:
        """Which plan step ran out of memory, against what the plan placed on its GPU."""
        dev = next(
            (d for d in self.plan.devices if any(s.index == step.index for s in d.steps)),
            self.plan.devices[0],
        )
        gib = 1 << 30
        return (
            f"rollplex: out of memory in plan step '{step.name}' ({step.kind}) of RL step "
            f"{rl_step}; the plan's peak on '{dev.name}' is {dev.peak_bytes / gib:.1f} GiB of "
            f"its {dev.budget_bytes / gib:.1f} GiB budget, so this step holds memory the plan "
            "does not price: raise hardware.hbm_reserve or plan a smaller step"
        )

    def _issue(
        self,
        k: int,
        step: Step,
        env: Env,
        rl_step: int,
        memory: list[MemoryEvent],
    ) -> MeasuredStep:
        """Step `k` of the order: its loads, its op, its frees, and what that left resident."""
        dev = self.dev_of[step.index]
        own = dev if self.pooled is None else self.pooled.pools.device  # whose memory
        # CUDA: the step's loads and its op are issued on its stream, after its waits.
        issue = (
            nullcontext()
            if self.cuda is None
            else self.cuda.issue(dev, step, self._reads(step, env))
        )
        for a in self._engine.before.get(k, ()):
            self.backend.residency(a)
        t0 = self._now()
        with issue:
            for v in self._allocs.get(k, ()):
                if v in env.host and v not in env.device:
                    env.device[v] = self.backend.move(env.host.pop(v), to_host=False)
            reads, note, deviation = self._run(step, env)
        t1 = self._now()
        if deviation:
            self._runtime_deviation(k, deviation)
        for msg in [] if self.cuda is None else self.cuda.take_notes(dev, step):
            self._runtime_deviation(k, msg)  # e.g. a graph not captured on its partition
        if k in self._stream_notes:
            note = "; ".join(n for n in (self._stream_notes[k], note) if n)
        # One walk of the resident values per change (thousands of weight and optimizer
        # tensors): after the op, and again only when a free or a residency move followed.
        now = env.attribution(self._owned[own])
        resident = sum(now.values())
        memory += self._ledger.events(now, own, t1, step.name)
        freed = [v for v in self._frees.get(k, ()) if self._free(env, v)]
        moves = self._engine.after.get(k, ())
        for a in moves:
            self.backend.residency(a)
        if freed or moves:
            now = env.attribution(self._owned[own])
            memory += self._ledger.events(now, own, t1, step.name)
        after = sum(now.values())
        m = MeasuredStep(step, own, rl_step, t0, t1, resident, after, env.host_bytes(), reads, note)
        m.freed, m.deviations = freed, list(self.deviations.get(k, ()))
        return m

    def _ledger_devices(self) -> list[int]:
        """The device groups whose memory this process accounts for."""
        if self.pooled is not None:
            return [self.pooled.pools.device]
        return list(range(len(self.plan.devices)))

    def _runtime_deviation(self, k: int, msg: str) -> None:
        """A deviation the backend reports while running: logged the first time it is seen
        at this position, on the step (and in the trace) every time."""
        if msg not in self.deviations.get(k, ()):
            level = logging.DEBUG if msg.endswith(RAN_ALONE) else logging.WARNING
            log.log(level, "executor: at '%s': %s", self.order[k].name, msg)
            self._deviate(k, msg)

    def _now(self) -> float:
        return time.perf_counter() - self.origin

    def _place(self, env: Env, externals: dict[str, Any]) -> None:
        for name, value in externals.items():
            want_host = name in self._start_on_host
            was_host = self._placed.get(name, self.graph.values[name].kind is ValueKind.HOST_DATA)
            share = self._shares.get(name, 1.0)
            if want_host != was_host:  # e.g. the first step of a plan that offloads weights
                value = self.backend.move(value, to_host=want_host, share=share)
            (env.host if want_host else env.device)[name] = value
        for name, value in self._carried.items():
            env.device.setdefault(name, value)

    def _reads(self, step: Step, env: Env) -> Iterator[torch.Tensor]:
        names = [step.op] if step.kind in COPY_KINDS else self.graph.ops[step.op].inputs.values()
        return iter_tensors(
            [env.device.get(n, env.host.get(n)) for n in names if n not in self._unmoved]
        )

    def _run(self, step: Step, env: Env) -> tuple[dict[str, str], str, str]:
        """(weights versions read, a note on the step, a deviation from the plan)."""
        if step.kind == "offload":
            value = self._take(env, step, step.op)
            env.host[step.op] = self.backend.move(value, to_host=True, share=step.share)
            return {}, "", ""
        if step.kind == "onload":
            if step.op not in env.host:
                raise ExecutionError(f"'{step.name}' onloads '{step.op}', which is not on host")
            value = env.host.pop(step.op)
            env.device[step.op] = self.backend.move(value, to_host=False, share=step.share)
            return {}, "", ""
        if self.pooled is not None and step.index in self.pooled.transfers:
            return (*self.pooled.run(step, env), "")
        if step.kind == "transfer":
            return {}, "one process: the values are already shared", ""
        op = self.graph.ops[step.op]
        if step.previous_step and any(v not in env.device for v in op.inputs.values()):
            return {}, "first RL step: no previous update to carry", ""
        inputs = {p: self._get(env, step, v) for p, v in op.inputs.items()}
        carry = env.carry.setdefault(op.name, {"next": 0})
        if carry["next"] != step.chunk:
            raise ExecutionError(
                f"'{step.name}' issued before chunk {carry['next']} of '{op.name}'"
            )
        carry["next"] += 1
        rides = step.corun is CoRun.PIGGYBACK
        result = self.backend.run_op(op, inputs, Chunk(step.chunk, step.chunks, rides), carry)
        if step.chunk == step.chunks - 1:
            env.carry.pop(op.name, None)
            missing = set(op.outputs) - set(result.outputs)
            if missing:
                raise ExecutionError(f"'{step.name}': backend returned no {sorted(missing)}")
            for port, v in op.outputs.items():
                env.device[v] = result.outputs[port]
        return result.reads, result.note, result.deviation

    def _get(self, env: Env, step: Step, value: str) -> Any:
        if value in env.device:
            return env.device[value]
        where = "on host (offloaded, not onloaded)" if value in env.host else "not produced yet"
        raise ExecutionError(f"'{step.name}' reads '{value}', which is {where}")

    def _take(self, env: Env, step: Step, value: str) -> Any:
        if value not in env.device:
            raise ExecutionError(f"'{step.name}' offloads '{value}', which is not resident")
        return env.device.pop(value)

    def _free(self, env: Env, value: str) -> bool:
        """Drop `value` from the device store; whether it was there."""
        if value not in env.device:
            return False  # offloaded already, or never made (a first step's carry)
        held = env.device.pop(value)
        if value in self._persistent:
            env.kept[value] = held  # the model still holds it: resident in truth
        release = getattr(held, "release", None)
        if callable(release) and not self.graph.values[value].external:
            release()  # e.g. gradients: the plan frees them, so really free them
        return True

    def _finish(self, env: Env) -> None:
        for name in self._persistent:  # where it physically is now (freed: still resident)
            self._placed[name] = name in env.host
        self._carried = {
            v: env.device[v]
            for s in self.order
            if s.previous_step
            for v in self.graph.ops[s.op].inputs.values()
            if v in env.device
        }
        env.device.clear()
        env.host.clear()
        env.carry.clear()
        env.kept.clear()
