"""Ill-formed variants of the tiny GRPO step: the audit's 21 graphs and a few more. Each
maker edits a copy in place and returns the name its error must carry (op or value)."""

from __future__ import annotations

from collections.abc import Callable

from rollplex.graph.ir import Graph, Op, Phase, Value, ValueKind

K = ValueKind


def _cycle(g: Graph) -> str:
    g.ops["rollout.prefix_prefill"].inputs["features"] = "train.vision_encode.features"
    g.ops["train.vision_encode"].inputs["pixels"] = "rollout.advantage.advantages"
    return "op '"


def _undefined_value(g: Graph) -> str:
    g.ops["train.policy_loss"].inputs["advantages"] = "no.such.value"
    return "no.such.value"


def _missing_producer(g: Graph) -> str:
    g.add_value(Value("ghost", (16, 16), "float32", K.ACTIVATION))
    g.ops["train.policy_loss"].inputs["old_logprobs"] = "ghost"
    return "train.policy_loss"


def _two_producers(g: Graph) -> str:
    g.ops["reference.vision_encode"].outputs["features"] = "train.vision_encode.features"
    return "train.vision_encode.features"


def _external_produced(g: Graph) -> str:
    g.values["rollout.reward.rewards"].external = True
    return "rollout.reward.rewards"


def _wrong_dtype(g: Graph) -> str:
    g.values["rollout.decode.responses"].dtype = "float32"
    return "rollout.decode"


def _wrong_kind(g: Graph) -> str:
    g.values["rollout.advantage.advantages"].kind = K.KV_CACHE
    return "rollout.advantage"


def _group_size_mismatch(g: Graph) -> str:
    g.ops["rollout.decode"].attrs["group_size"] = 3
    return "rollout.decode"


def _group_size_zero(g: Graph) -> str:
    g.ops["rollout.advantage"].attrs["group_size"] = 0
    return "rollout.advantage"


def _shape_mismatch(g: Graph) -> str:
    adv = g.values["rollout.advantage.advantages"]
    adv.shape = (adv.shape[0] + 1,)
    return "rollout.advantage.advantages"


def _wrong_rank(g: Graph) -> str:
    g.values["rollout.reward.rewards"].shape = (16, 2)
    g.values["rollout.decode.responses"].shape = (16,)
    return "rollout.decode"


def _unknown_kind(g: Graph) -> str:
    g.ops["rollout.reward"].kind = "reward_v2"
    return "reward_v2"


def _unknown_port(g: Graph) -> str:
    g.ops["rollout.reward"].inputs["hint"] = "prompts.text"
    return "rollout.reward"


def _required_input(g: Graph) -> str:
    del g.ops["train.backward"].inputs["loss"]
    return "train.backward"


def _required_output(g: Graph) -> str:
    del g.ops["rollout.decode"].outputs["responses"]
    return "rollout.decode"


def _stale_weights(g: Graph) -> str:
    g.values["policy.weights"].version = "policy@-1"  # the rollout read last step's weights
    g.add_value(Value("policy.weights.now", (312448,), "float32", K.WEIGHTS, "policy@0", True))
    for name in ("train.logprob", "train.backward", "update.optimizer_step"):
        g.ops[name].inputs["weights"] = "policy.weights.now"
    return "train."


def _coefs(g: Graph) -> str:
    g.add_value(Value("combined", (16,), "float32", K.ACTIVATION, "policy@0"))
    g.add_op(
        Op(
            "rollout.combine",
            "combine_rewards",
            Phase.ROLLOUT,
            {"rewards_0": "rollout.reward.rewards"},
            {"rewards": "combined"},
            {"coefs": [1.0, 0.5]},
        )
    )
    return "rollout.combine"


# -- the five lint accepted before ------------------------------------------------------
def _stale_external(g: Graph) -> str:
    g.add_value(Value("old.logprobs", (16, 16), "float32", K.ACTIVATION, "policy@-1", True))
    g.ops["train.policy_loss"].inputs["old_logprobs"] = "old.logprobs"
    return "old.logprobs"


def _unversioned_trained(g: Graph) -> str:
    g.values["policy.weights"].version = None
    return "policy.weights"


def _train_named(g: Graph, weights: str, n: int, stem: str) -> None:
    """A backward and an optimizer step for `weights` (n parameters)."""
    model = weights.split(".")[0]
    g.add_value(Value(f"{model}.adam", (n, 3), "float32", K.OPTIMIZER_STATE, f"{model}@0", True))
    grads = f"{stem}.grads"
    g.add_value(Value(grads, (n,), "float32", K.GRAD, "policy@0"))
    ins = {"loss": "train.policy_loss.loss", "weights": weights, "saved_0": "train.logprob.saved"}
    g.add_op(Op(f"train.{stem}_backward", "backward", Phase.TRAIN, ins, {"grads": grads}))
    outs = {"weights": f"{stem}.new", "state": f"{stem}.state"}
    g.add_value(Value(f"{stem}.new", (n,), "float32", K.WEIGHTS, f"{model}@1"))
    g.add_value(Value(f"{stem}.state", (n, 3), "float32", K.OPTIMIZER_STATE, f"{model}@1"))
    ins = {"weights": weights, "grads": grads, "state": f"{model}.adam"}
    g.add_op(Op(f"update.{stem}_optimizer_step", "optimizer_step", Phase.UPDATE, ins, outs))


def _train_reference(g: Graph) -> str:
    _train_named(g, "ref.weights", 312448, "ref")
    return "ref.weights"


def _train_shared_vision(g: Graph) -> str:
    _train_named(g, "vision.weights", 257344, "vision")
    return "vision.weights"


def _unknown_weights_dtype(g: Graph) -> str:
    g.values["policy.weights"].dtype = "float8"
    return "policy.weights"


def _bad_version(g: Graph) -> str:
    g.values["ref.weights"].version = "ref-0"
    return "ref.weights"


def _zero_dim(g: Graph) -> str:
    g.values["prompts.text"].shape = (4, 0)
    return "prompts.text"


def _bad_phase(g: Graph) -> str:
    g.ops["rollout.reward"].phase = "scoring"  # type: ignore[assignment]
    return "rollout.reward"


BAD_GRAPHS: dict[str, Callable[[Graph], str]] = {
    "cycle": _cycle,
    "undefined value": _undefined_value,
    "missing producer": _missing_producer,
    "two producers": _two_producers,
    "external value produced": _external_produced,
    "wrong dtype": _wrong_dtype,
    "wrong value kind": _wrong_kind,
    "group size mismatch": _group_size_mismatch,
    "group size zero": _group_size_zero,
    "shape mismatch": _shape_mismatch,
    "wrong rank": _wrong_rank,
    "unknown op kind": _unknown_kind,
    "unknown port": _unknown_port,
    "required input unwired": _required_input,
    "required output unwired": _required_output,
    "stale weights": _stale_weights,
    "coefs per reward": _coefs,
    "stale external policy@-1": _stale_external,
    "unversioned trained weights": _unversioned_trained,
    "optimizer step on the frozen reference": _train_reference,
    "optimizer step on the shared vision tower": _train_shared_vision,
    "unknown weights dtype": _unknown_weights_dtype,
    "malformed version": _bad_version,
    "zero dim": _zero_dim,
    "unknown phase": _bad_phase,
}
