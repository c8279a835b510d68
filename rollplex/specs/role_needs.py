"""What each role needs from a run, declared as data: the world it runs on, its TP degrees,
its device kinds, the knobs it reads and the settings it refuses.

One check (jobs/validate_run.py) reads these declarations for the chosen roles and refuses
a bad combination by name before anything loads; a declaration imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any


def field_value(spec: Any, path: str) -> Any:
    """`spec`'s value at a dotted path ("backend.fsdp.rollout_tp")."""
    return reduce(getattr, path.split("."), spec)


@dataclass(slots=True, frozen=True)
class When:
    """A condition on one field: its value is one of `is_`, or (with `not_`) none of them."""

    field: str  # dotted RunSpec path
    is_: tuple[Any, ...] = ()
    not_: tuple[Any, ...] = ()

    def holds(self, spec: Any) -> bool:
        value = field_value(spec, self.field)
        return value in self.is_ if self.is_ else value not in self.not_


@dataclass(slots=True, frozen=True)
class Refusal:
    """A combination a role cannot run: refused when every condition holds. `message` is
    the one line said, a str.format template over the spec's sections ({backend.rollout})."""

    when: tuple[When, ...]
    message: str

    def holds(self, spec: Any) -> bool:
        return all(w.holds(spec) for w in self.when)

    def says(self, spec: Any) -> str:
        return self.message.format(**{k: getattr(spec, k) for k in type(spec).model_fields})


@dataclass(slots=True, frozen=True)
class RoleNeeds:
    """What one role implementation (`backend.<role>=<name>`) needs from a run."""

    role: str  # "rollout" | "reference" | "trainer"
    name: str  # "torch" | "vllm" | "fsdp"
    # one process per rank under torchrun: the run is planned for and checked against
    # WORLD_SIZE (otherwise it runs in one process, whatever the plan's GPU count)
    torchrun: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")  # the train.device kinds it runs on
    reads: tuple[str, ...] = ()  # the knob sections it reads (the others are ignored)
    refuses: tuple[Refusal, ...] = ()  # in the order they are checked
    # TP degrees it runs at: each must divide the torchrun world (a replica takes whole ranks)
    tp_fields: tuple[str, ...] = ()
    # knobs whose Triton kernels need CUDA and Triton: refused when set true elsewhere
    cuda_knobs: tuple[str, ...] = ()
    # "module:function"s of the layout arithmetic that needs the world (no torch import):
    # (spec, world) -> the spec planned for that world; (spec, world) -> None or ValueError
    world_plan: str | None = None
    world_check: str | None = None

    @property
    def where(self) -> str:
        return f"backend.{self.role}={self.name}"

    def refusal(self, spec: Any, world: int = 1) -> str | None:
        """The first declared refusal that holds for `spec` on `world` ranks, else None."""
        device = spec.train.device
        if device.split(":")[0] not in self.devices:
            return f"{self.where} runs on {' or '.join(self.devices)}, not train.device={device}"
        for r in self.refuses:
            if r.holds(spec):
                return r.says(spec)
        for f in self.tp_fields if self.torchrun else ():
            tp = field_value(spec, f)
            if world % tp:
                return (
                    f"{f}={tp} does not divide the {world} torchrun ranks: each rollout "
                    "replica takes rollout_tp whole ranks"
                )
        return None


def _reads_vllm_logprobs(field: str, name: str, why: str) -> Refusal:
    """Refuses `field` true behind a vLLM rollout that returns no logprobs."""
    return Refusal(
        (When(field, is_=(True,)), When("backend.vllm.return_logprobs", is_=(False,))),
        f"{name} with backend.rollout=vllm: {why}; set backend.vllm.return_logprobs=true",
    )


_ENGINE = "backend.torch_engine"
_FSDP = "rollplex.backends.fsdp.checks"
NEEDS: dict[tuple[str, str], RoleNeeds] = {
    ("rollout", "torch"): RoleNeeds(
        "rollout",
        "torch",
        reads=(_ENGINE,),
        cuda_knobs=(f"{_ENGINE}.skinny_gemm", f"{_ENGINE}.split_kernel", f"{_ENGINE}.split_gemm"),
    ),
    ("rollout", "vllm"): RoleNeeds(
        "rollout",
        "vllm",
        reads=("backend.vllm",),
        refuses=(
            Refusal(
                (When("backend.vllm.return_logprobs", is_=(True,)), When("algo.top_p", not_=(1,))),
                "backend.vllm.return_logprobs=true with algo.top_p={algo.top_p}: vLLM's "
                "logprobs are then renormalised over the nucleus, not the log softmax(logits/T) "
                "the trainer scores; use top_p=1 or return_logprobs=false",
            ),
            _reads_vllm_logprobs(
                "algo.kl_in_reward",
                "algo.kl_in_reward",
                "the KL penalty in the reward reads the rollout's logprobs before training",
            ),
            _reads_vllm_logprobs(
                "algo.rollout_correction.enabled",
                "algo.rollout_correction",
                "the correction weighs tokens by the engine's own logprobs",
            ),
        ),
    ),
    ("reference", "torch"): RoleNeeds("reference", "torch"),
    # PPO resumes: its checkpoints hold the critic (checkpoint.py, dcp_checkpoint.py check it)
    ("trainer", "torch"): RoleNeeds("trainer", "torch"),
    ("trainer", "fsdp"): RoleNeeds(
        "trainer",
        "fsdp",
        torchrun=True,
        reads=("backend.fsdp",),
        refuses=(
            Refusal(
                (
                    When("train.response_lengths", is_=("workload",)),
                    When("backend.fsdp.rollout_tp", not_=(1,)),
                ),
                "train.response_lengths=workload with backend.fsdp.rollout_tp > 1: a TP "
                "group decodes its members' rows together; use rollout_tp=1",
            ),
            Refusal(
                (When("algo.name", is_=("reinforce_plus_plus_baseline",)),),
                "algo.name=reinforce_plus_plus_baseline with backend.trainer=fsdp: it whitens "
                "advantages over the whole batch, and each rank scores only its own prompts; "
                "use backend.trainer=torch",
            ),
            Refusal(
                (When("algo.name", is_=("ppo",)), When("schedule.name", is_=("disaggregated",))),
                "schedule.name=disaggregated with algo=ppo and backend.trainer=fsdp: the "
                "training pool builds no critic; use schedule=serial or rollplex",
            ),
            *(
                Refusal(
                    (When(f"backend.{partner}", not_=("torch",)),),
                    "backend.trainer=fsdp with backend.rollout={backend.rollout}, "
                    "backend.reference={backend.reference}: the FSDP2 trainer brings its own "
                    "torch rollout and reference (full models on every rank); use "
                    "backend.rollout=torch backend.reference=torch",
                )
                for partner in ("rollout", "reference")
            ),
            Refusal(
                (
                    When("backend.fsdp.rollout_tp", not_=(1,)),
                    When("backend.fsdp.rollout_sync", not_=("share",)),
                ),
                "backend.fsdp.rollout_tp={backend.fsdp.rollout_tp} needs "
                "backend.fsdp.rollout_sync=share (here {backend.fsdp.rollout_sync}): only the "
                "shared rollout runs tensor-parallel",
            ),
        ),
        tp_fields=("backend.fsdp.rollout_tp",),
        world_plan=f"{_FSDP}:world_spec",
        world_check=f"{_FSDP}:check_fsdp_world",
    ),
}


def needs_of(role: str, name: str) -> RoleNeeds:
    """The declaration of `backend.<role>=<name>` (names are checked by BackendSpec)."""
    return NEEDS[role, name]


def chosen_needs(backend: Any) -> tuple[RoleNeeds, ...]:
    """The declarations of the roles a BackendSpec chooses: trainer, rollout, reference."""
    return tuple(needs_of(r, getattr(backend, r)) for r in ("trainer", "rollout", "reference"))


__all__ = ["NEEDS", "Refusal", "RoleNeeds", "When", "chosen_needs", "field_value", "needs_of"]
