"""Where the roles run: GPUs, parallel degrees, and the solo time of each op there.

A `RoleLayout` is one pool of GPUs running a role with given TP/DP degrees. Rollout ops
use the rollout layout (tensor parallel over `tp`, data parallel over the rest); the
reference, training and update ops use the training layout (FSDP over all its GPUs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rollplex.graph.ir import Graph, Op, Phase
from rollplex.ops import formulas as F
from rollplex.ops.costs import CostContext, op_cost
from rollplex.ops.formulas import Cost
from rollplex.ops.formulas.llm import decoder_weight_bytes, lm_head_weight_bytes
from rollplex.ops.micro_batches import (
    largest_share,
    micro_batches_run,
    op_micro_batches,
    op_units,
    trained_forward,
    trained_units,
)
from rollplex.ops.rollout_costs import decode_steps
from rollplex.planner.cost_model import (
    BACKWARD_KERNELS_PER_LAYER,
    FORWARD_KERNELS_PER_LAYER,
    CostModel,
    Timing,
)
from rollplex.planner.shared_weights import alias_sync_bytes, replica_sync_bytes
from rollplex.planner.sizing import train_micro_batches
from rollplex.specs import HardwareSpec, ModelSpec, WorkloadSpec

LOGPROB_KINDS = frozenset({"logprob", "logprob_prefix", "logprob_response"})
TRAINER_MICRO_KINDS = frozenset({"logprob", "logprob_response", "backward"})


@dataclass(slots=True, frozen=True)
class RoleLayout:
    gpus: int
    tp: int = 1

    @property
    def dp(self) -> int:
        return max(1, self.gpus // self.tp)

    def link_gbps(self, hw: HardwareSpec) -> float:
        """Bandwidth of collectives across this pool: NVLink inside a node, else network."""
        return hw.nvlink_gbps if self.gpus <= hw.gpus_per_node else hw.internode_gbps


def default_rollout_tp(model: ModelSpec, hw: HardwareSpec, gpus: int) -> int:
    """Smallest power-of-two TP whose weight shard takes at most 35% of HBM (room for KV)."""
    weights = model.param_count() * model.dtype_bytes
    tp = 1
    while weights / tp > 0.35 * hw.hbm_bytes and tp * 2 <= min(gpus, hw.gpus_per_node):
        tp *= 2
    return tp


@dataclass(slots=True)
class OpTimer:
    """Solo time of graph ops on a given pair of role layouts."""

    graph: Graph
    model: ModelSpec
    workload: WorkloadSpec
    hardware: HardwareSpec
    cost_model: CostModel
    rollout: RoleLayout
    train: RoleLayout
    micro_tokens: int = 16384
    colocated: bool = True  # False: the roles run on two pools (disaggregated)
    micro_recompute: bool = False  # schedule.train_micro_recompute
    micro_fused: bool = False  # schedule.train_micro_fused
    packed_responses: bool = True  # schedule.pack_responses

    def context(self, op: Op, chunks: int = 1) -> CostContext:
        """Chunks split a rank's rows further, like more data-parallel ranks would."""
        if op.phase is Phase.ROLLOUT:
            r = self.rollout
            return CostContext(
                self.model,
                self.workload,
                tp=r.tp,
                dp=r.dp * chunks,
                packed_responses=self.packed_responses,
            )
        t = self.train
        return CostContext(
            self.model,
            self.workload,
            tp=t.tp,
            dp=t.dp * chunks,
            shards=t.gpus,
            recompute_forward=self.micro_recompute,
            fused_forward=self.micro_fused,
            micro_batches=self._train_micro_batches(),
            packed_responses=self.packed_responses,
        )

    def _train_micro_batches(self) -> int:
        """The step's training micro-batch count, which the trainer runs (1 unsplit)."""
        if self.micro_tokens <= 0:
            return 1
        return train_micro_batches(
            self.model, self.workload, self.graph, self.train.gpus, self.micro_tokens
        )

    def time(self, op: Op, chunks: int = 1) -> Timing:
        """Solo time of `op`, or of one of its `chunks` row chunks, on one GPU: priced in
        its micro-batches (each reads the weights and launches its kernels again), its
        scratch one micro-batch's."""
        ctx = self.context(op, chunks)
        step = self._step_count(op)
        if step is not None:
            # The trainer's step-wide count is shared by the op's row chunks; unchunked, a
            # run's scratch is its largest micro-batch's (whole units: uneven past a count
            # that divides them).
            runs, units = max(1, math.ceil(step / chunks)), self._trained_units(op)
            share = 1 / step if chunks > 1 or units is None else largest_share(units, step)
        else:
            runs, share = self.op_micro_batches(op, chunks), 1.0
            if runs > 1:
                units, _ = op_units(self.graph, op, self.workload.response_length.mean)
                share = largest_share(math.ceil(units / ctx.dp), runs)
        ctx = replace(ctx, run_share=share)  # the head's chunks cap one run's
        cost = op_cost(self.graph, op, ctx)
        return replace(
            self._time(op, ctx, cost, (runs, self._kernels(op, ctx))),
            scratch_bytes=cost.transient_bytes * share,
        )

    def eager_decode_step_s(self) -> float:
        """One decode step's layers launched one kernel at a time: what a step that
        piggybacked rows ride costs the host, since it leaves the engine's graph."""
        return self.model.num_layers * FORWARD_KERNELS_PER_LAYER * self.cost_model.launch_s

    def op_micro_batches(self, op: Op, chunks: int = 1) -> int:
        """The micro-batches the runtime cuts a forward outside the trainer's into
        (ops/micro_batches.py `op_micro_batches`; `Plan.meta["op_micro_batches"]`), 1 for
        an op it runs whole: one of a plan's row chunks is already a cut, and runs whole."""
        if chunks > 1 or self.micro_tokens <= 0:
            return 1
        ctx = self.context(op)
        mean = self.workload.response_length.mean
        return op_micro_batches(
            self.graph, op, ctx.dp, self.micro_tokens, mean, ctx.tp, ctx.micro_batches
        )

    def _step_count(self, op: Op) -> int | None:
        """The micro-batches the trainer runs `op` in, for the ops it runs in them (its
        forwards with grad and their backward: the plan's count, at most one per unit of
        the forward, ops/micro_batches.py); else None."""
        if op.phase is not Phase.TRAIN or op.kind not in TRAINER_MICRO_KINDS:
            return None
        count = self._train_micro_batches()
        units = self._trained_units(op)
        return count if units is None else micro_batches_run(units, count)

    def _trained_units(self, op: Op) -> int | None:
        """Units per rank of the training forward `op` runs in micro-batches of (None: it
        has none, ops/micro_batches.py `trained_forward`)."""
        fwd = trained_forward(self.graph, op)
        if fwd is None:
            return None
        return trained_units(self.graph.inputs_of(fwd), self.train.gpus)[0]

    def _kernels(self, op: Op, ctx: CostContext) -> int:
        """Kernels one micro-batch of `op` launches: per layer, a forward's, or a backward's
        with the forward it recomputes (checkpointing) and the one it runs again
        (`train_micro_recompute`); decode steps are graph replays (priced per step)."""
        if op.kind in ("decode", "generate", "optimizer_step", "weight_sync", "attach_prefix"):
            return 0  # attach_prefix runs no forward: it hands the backward an export
        if op.kind == "attach_response":
            return 0  # decode once: no layer forward, the LM head's few (in `launches`)
        if op.kind == "vision_encode":
            return self.model.vision.depth * FORWARD_KERNELS_PER_LAYER
        if op.kind == "backward":
            forwards = int(ctx.checkpointing) + int(ctx.recompute_forward)
            per_layer = BACKWARD_KERNELS_PER_LAYER + forwards * FORWARD_KERNELS_PER_LAYER
            return self.model.num_layers * per_layer
        if op.kind in LOGPROB_KINDS or op.kind == "prefix_prefill" or "weights" in op.inputs:
            return self.model.num_layers * FORWARD_KERNELS_PER_LAYER
        return 0  # rewards, advantages, losses: a few kernels, in `launches`

    def _time(self, op: Op, ctx: CostContext, cost: Cost, micro: tuple[int, int]) -> Timing:
        t = self._solo_time(op, ctx, cost, micro)
        if (
            op.phase is Phase.ROLLOUT
            or ctx.tp == 1
            or cost.weight_bytes <= 0
            or op.kind in ("optimizer_step", "weight_sync")
        ):
            return t
        # Training-layout TP (reference and train forwards, backward): two all-reduces of
        # the hidden state per layer in each forward, the same again in the backward and
        # once more in its recompute. They sit on the critical path (the next layer needs
        # their result), so nothing hides them.
        vision = op.kind == "vision_encode"
        params = self.model.vision.param_count() if vision else self.model.llm_param_count()
        tokens = cost.flops / max(1.0, 2 * params / ctx.tp)
        passes = 1
        if op.kind == "backward":
            tokens /= 3  # flops of backward + recompute: about 3 forwards
            passes = 2 if ctx.checkpointing else 1  # the backward's own, the recompute's
        comm = passes * F.tp_allreduce_bytes(self.model, tokens, ctx.tp, vision=vision)
        s = self.cost_model.transfer_s(comm, self.hardware.nvlink_gbps)
        return replace(t, seconds=t.seconds + s, comm_s=t.comm_s + s)

    def _solo_time(self, op: Op, ctx: CostContext, cost: Cost, micro: tuple[int, int]) -> Timing:
        """`micro`: (micro-batches, kernels each) of a forward or backward."""
        hw, cm = self.hardware, self.cost_model
        runs, kernels = micro
        if op.kind in ("decode", "generate"):  # generate: an engine's prefill + decode
            steps = decode_steps(self.graph, op, ctx)
            comm = (
                F.tp_allreduce_bytes(
                    self.model, cost.flops / max(1.0, self._flops_per_token(ctx)), ctx.tp
                )
                if ctx.tp > 1
                else 0.0
            )
            # fixed_s[kind] per layer of each step: the small kernels a step replays
            layers = steps * self.model.num_layers
            return cm.time(
                op.kind, cost, launches=max(1, steps), comm_bytes=comm, fixed_runs=layers
            )
        if op.kind == "weight_sync":
            return self.sync_time(op)
        # fixed_s[kind] per micro-batch of the trainer's (its forwards with grad and their
        # backward: what it does per micro-batch beyond the kernels), else once
        fixed = runs if self._step_count(op) is not None else 1
        if op.phase is Phase.ROLLOUT:
            tokens = cost.flops / max(1.0, self._flops_per_token(ctx))
            comm = F.tp_allreduce_bytes(self.model, tokens, ctx.tp) if ctx.tp > 1 else 0.0
            return cm.time(
                op.kind, cost, comm_bytes=comm, micro_batches=runs, kernels=kernels,
                fixed_runs=fixed,
            )  # fmt: skip
        if self._fsdp(op, cost):
            return cm.time(
                op.kind,
                cost,
                comm_bytes=self._fsdp_comm_bytes(op, ctx, cost),
                comm_gbps=self.train.link_gbps(hw),
                overlap_comm=True,
                micro_batches=runs,
                kernels=kernels,
                fixed_runs=fixed,
            )
        return cm.time(op.kind, cost, micro_batches=runs, kernels=kernels, fixed_runs=fixed)

    def _fsdp(self, op: Op, cost: Cost) -> bool:
        return cost.weight_bytes > 0 and op.kind != "optimizer_step" and self.train.gpus > 1

    def _fsdp_comm_bytes(self, op: Op, ctx: CostContext, cost: Cost) -> float:
        """FSDP gathers each layer's weights before use (1/n is local, the rest crosses
        links); backward also reduce-scatters the gradients. A backward through a split
        forward (prefix and response parts) is one autograd pass over one set of layers: it
        gathers and reduce-scatters once, not once per part."""
        n = self.train.gpus
        weights = cost.weight_bytes
        if op.kind == "backward":
            parts = self._llm_parts(op)
            if parts > 1:
                one = decoder_weight_bytes(self.model, ctx.tp) * (
                    2 if ctx.checkpointing else 1
                ) + lm_head_weight_bytes(self.model, ctx.tp)
                weights -= (parts - 1) * one
        return weights * (n - 1) / n * (1.5 if op.kind == "backward" else 1.0)

    def _llm_parts(self, op: Op) -> int:
        """Distinct LLM forwards whose kept activations a backward reads."""
        g, seen = self.graph, set()
        for port, v in op.inputs.items():
            fwd = g.producer(v) if port.startswith("saved") else None
            if fwd is not None and fwd.kind in LOGPROB_KINDS:
                seen.add(fwd.name)
        return len(seen)

    def packed(self, prefix: Op, response: Op) -> tuple[Timing, Timing]:
        """The prefix and response parts of one forward run back to back as one packed
        forward (shared-prefix mask; or the gathered weights kept across both parts): one
        FSDP gather for the pair. The prefix step carries the gather's exposed excess over
        the pair's compute; the response step only its own compute."""
        tp_, tr = self.time(prefix), self.time(response)
        ctx = self.context(prefix)
        cost = op_cost(self.graph, prefix, ctx)
        if not self._fsdp(prefix, cost) or tp_.comm_s <= 0:
            return tp_, tr
        launch = self.cost_model.launch_s + self.cost_model.dispatch_s
        body_p = max(tp_.compute_s, tp_.memory_s) + tp_.launch_bound_s
        body_r = max(tr.compute_s, tr.memory_s) + tr.launch_bound_s
        comm = max(tp_.comm_s, tr.comm_s)
        exposed = max(0.0, comm - body_p - body_r)
        return (
            replace(tp_, seconds=body_p + exposed + launch, comm_s=comm),
            replace(tr, seconds=body_r + launch, comm_s=0.0),
        )

    def sync_time(self, op: Op, cross_pool: bool = False) -> Timing:
        """Rebuild the rollout's TP shard from the trainer: a gather inside the pool, or a
        transfer over the network between pools (disaggregated).

        Aliased (mode "alias", colocated): only the bytes the layout algebra says the
        rollout shard lacks in training storage move (`shared_weights`, in the rollout's
        own layout: `attrs["layout"]`): those other GPUs hold cross the pool's links,
        those held locally but not readable in place are copied at HBM speed (read +
        write), as is the FSDP2 shared rollout's cast of the fp32 masters. The FSDP2
        gathered replica (attrs["layout"] "replica") gathers every fp32 master and casts
        it in. All GPUs rebuild at once, so the slowest GPU sets the time; nothing to move
        costs only the launch."""
        w = self.graph.values[op.inputs["weights"]]
        hw = self.hardware
        cross_pool = cross_pool or not self.colocated
        per_gpu = w.nbytes / self.rollout.tp
        gbps = hw.internode_gbps if cross_pool else self.rollout.link_gbps(hw)
        layout = op.attrs.get("layout", "algebra")  # the rollout's own (shared_weights)
        moves = None
        if not cross_pool and layout == "replica":  # the FSDP2 gather: masters in, cast
            moves = replica_sync_bytes(self.model, self.train.gpus)
        elif not cross_pool and op.attrs.get("mode", "alias") == "alias":
            tr, rt = self.train, self.rollout
            moves = alias_sync_bytes(self.model, w, tr.gpus, tr.tp, rt.tp, layout)
            if moves is None:
                per_gpu *= 1 - 1 / max(1, self.train.gpus)  # no algebra: all but the local shard
        if moves is not None:
            link, hbm = self.train.link_gbps(hw) * 1e9, hw.hbm_bandwidth_gbps * 1e9
            s = max(r / link + 2 * c / hbm for r, c in moves) + self.cost_model.launch_s
            return Timing(s + self.cost_model.dispatch_s, 0.0, 0.0, s, "copy")
        # mode "load": an engine holds its own copy, every byte is copied into it
        s = self.cost_model.transfer_s(per_gpu, gbps)
        return Timing(s + self.cost_model.dispatch_s, 0.0, 0.0, s, "copy")

    def _flops_per_token(self, ctx: CostContext) -> float:
        return 2 * self.model.llm_param_count() / ctx.tp


def rows_chunks(rows: int, tokens_per_row: int, chunk_tokens: int) -> int:
    """How many chunks keep each at most `chunk_tokens` tokens (at least one row each)."""
    return max(1, min(rows, math.ceil(rows * tokens_per_row / chunk_tokens)))
