"""Checks of `rollout_sync=share` run inside each rank (worker.py `views --sync share`).

Every failed check raises (the process group then exits non-zero); what was checked comes
back as a per-rank report that test_share.py asserts on.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rollplex.backends.fsdp.shard import local
from rollplex.backends.fsdp.share import rollout_slice
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.dispatch import RoleDispatch
from rollplex.specs import HARDWARE_PRESETS, ModelSpec
from rollplex.specs.schedule import ScheduleSpec
from tests.distributed.worker import ALGO, MODEL, WORKLOAD

EMBED = "model.language_model.embed_tokens.weight"


def _rollout_params(b: RoleDispatch):
    """(rollout parameter name, algebra tensor name, local tensor, the parameter)."""
    tensors = b.rollout.sharing.tensors
    for name, p in b.rollout.model.named_parameters(remove_duplicate=False):
        lo = p.to_local() if isinstance(p, DTensor) else p
        yield name, name if name in tensors else EMBED, lo, p


def check_values(b: RoleDispatch, full: dict[str, torch.Tensor]) -> int:
    """Every rollout tensor == the gathered full parameter sliced to the rollout layout,
    bit for bit; and a DTensor's own reassembly (`full_tensor`) == the gathered full."""
    r, n = b.rollout, 0
    for name, tensor, lo, p in _rollout_params(b):
        want = rollout_slice(full, r.sharing, tensor, r.rank)
        if not torch.equal(lo.detach().flatten(), want):
            raise AssertionError(f"rank {r.rank}: rollout {name} != gathered full, sliced")
        if isinstance(p, DTensor):
            whole = full[tensor]
            if not torch.equal(p.full_tensor().reshape(whole.shape), whole):
                raise AssertionError(f"rank {r.rank}: DTensor {name} reassembles differently")
        n += 1
    return n


def check_aliases(b: RoleDispatch) -> tuple[int, int]:
    """Aliased tensors lie inside their trainer shard's storage (the compute copy: in
    float32 the master shard itself); rebuilt ones lie in the rebuild buffer.
    Returns (aliased, rebuilt) rollout tensors."""
    r = b.rollout
    masters = {n: local(p.detach()) for n, p in b.trainer.model.named_parameters()}
    shards = masters if not r._cast else r._shards
    if not r._cast and any(r._shards[n].data_ptr() != m.data_ptr() for n, m in masters.items()):
        raise AssertionError(f"rank {r.rank}: float32 compute copy is not the master shard")
    aliased = rebuilt = 0
    for name, tensor, lo, _ in _rollout_params(b):
        sh = r.sharing.share(tensor, r.rank)
        start = lo.untyped_storage().data_ptr()
        if r._aliased[tensor]:
            host = shards[sh.host]
            h0 = host.untyped_storage().data_ptr()
            a, e = lo.data_ptr(), lo.data_ptr() + lo.numel() * lo.element_size()
            inside = h0 <= a and e <= h0 + host.untyped_storage().nbytes()
            if start != h0 or not inside:
                raise AssertionError(f"rank {r.rank}: {name} is not inside {sh.host}'s storage")
            aliased += 1
        else:
            if start != r.buffer.untyped_storage().data_ptr():
                raise AssertionError(f"rank {r.rank}: rebuilt {name} is not in the buffer")
            rebuilt += 1
    return aliased, rebuilt


def check_live_update(b: RoleDispatch) -> str | None:
    """An in-place change of a trainer shard shows through the rollout, with no sync
    (None: no tensor is aliased on this rank, e.g. rollout TP 1 over 2 ranks)."""
    r = b.rollout
    found = next((x for x in _rollout_params(b) if r._aliased[x[1]]), None)
    if found is None:
        return None
    name, tensor, lo, _ = found
    host = r.sharing.share(tensor, r.rank).host
    shard = r._shards[host]  # float32: the trainer's master shard (checked in check_aliases)
    before, saved = lo.detach().clone(), shard.clone()
    with torch.no_grad():
        shard.add_(1.0)
    changed = torch.equal(lo.detach(), before + 1.0)
    with torch.no_grad():
        shard.copy_(saved)
    if not changed or not torch.equal(lo.detach(), before):
        raise AssertionError(f"rank {r.rank}: an in-place update of {host} is not seen by {name}")
    return name


def check_share(b: RoleDispatch, steps: int, model: ModelSpec = MODEL) -> dict:
    torch.use_deterministic_algorithms(True)
    hw, serial = HARDWARE_PRESETS["cpu"], ScheduleSpec(name="serial")
    planned = plan_step(model, WORKLOAD, ALGO, hw, serial)
    data = TaskData(model, WORKLOAD, seed=0)
    ex = Executor(planned.plan, planned.graph, b)
    checked, moved = 0, 0
    before = {n: v.clone() for n, v in b.trainer.full_parameters()}
    for k in range(steps):
        ex.run_step(k, data.step(k))
        assert b.rollout.weights_version == f"policy@{k + 1}", b.rollout.weights_version
        now = {n: v.clone() for n, v in b.trainer.full_parameters()}
        checked += check_values(b, {n: v.to(b.rollout.dtype) for n, v in now.items()})
        moved += sum(not torch.equal(before[n], now[n]) for n in now)
        before = now
    aliased, rebuilt = check_aliases(b)
    live = check_live_update(b)
    decode = check_decode(b, model)
    dist.barrier()
    return {
        "rank": dist.get_rank(), "world": dist.get_world_size(), "checked": checked,
        "moved": moved, "aliased": aliased, "rebuilt": rebuilt, "live": live,
        "stats": b.rollout.stats(), "decode": decode,
    }  # fmt: skip


def check_decode(b: RoleDispatch, model: ModelSpec, tokens: int = 4, group: int = 2) -> dict:
    """The shared rollout and a gather-and-copy rollout on the same trainer decode this
    rank's prompts of step 0: greedy, and sampled with the per-sample generators. Tokens
    must be equal; logprobs are returned as their largest difference (TP sums partial
    products in another order; TP 1 reads the very same values and must be bit-equal)."""
    from rollplex.backends.base import Sampling
    from rollplex.backends.fsdp.build import FsdpHooks, GatheredRollout, sample_seed
    from rollplex.backends.fsdp.shard import DTYPES
    from rollplex.backends.torch.model import model_for
    from rollplex.backends.torch.rows import text_only
    from rollplex.backends.torch.values import Pixels

    t, r = b.trainer, b.rollout
    dev = t.dist.device
    full = model_for(model, 0, dev, DTYPES[t.compute_dtype]).requires_grad_(False)
    gather = GatheredRollout(model, dev, full, t)
    gather.load_weights(t.live_weights())
    batch = TaskData(model, WORKLOAD, seed=0).step(0).batch
    lo, hi = FsdpHooks(0, t.dist.rank, t.world).rows(batch.size)
    mine = batch.select(lo, hi)
    st = model.special_tokens
    out: dict = {"max_logprob_diff": 0.0}
    for mode, temp in (("greedy", 0.0), ("sampled", 1.0)):
        runs = []
        for role in (r, gather):
            gens = [torch.Generator(dev).manual_seed(sample_seed(0, 0, row))
                    for row in range(lo * group, hi * group)]  # fmt: skip
            sampling = Sampling(tokens, temp, 1.0, st.eos_token_id, st.pad_token_id)
            with torch.no_grad():
                prefix = role.prefix_prefill(role.vision_encode(Pixels.of(mine)), text_only(mine))
                session = role.start_decode(prefix, group, sampling, gens)
                session.advance()
            runs.append(session.result())
        (ra, la), (rb, lb) = runs
        out[f"{mode}_tokens_equal"] = torch.equal(ra.tokens, rb.tokens) and torch.equal(
            ra.lengths, rb.lengths
        )
        diff = (la.values - lb.values).abs().max().item()
        out["max_logprob_diff"] = max(out["max_logprob_diff"], diff)
    return out
