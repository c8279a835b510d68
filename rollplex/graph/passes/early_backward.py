"""Whether a step's policy gradient may start before its rollout ends (issue 31.3).

The two-accumulator form (backends/torch/early_backward.py) equals the batch gradient only
when every policy loss reads `grpo`/`rloo` advantages and every trained forward reads the
rollout's weights version; `early_backward_refusal` names what breaks that in a graph,
`algo_refusal` in AlgoSpec's loss settings.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Phase
from rollplex.specs import AlgoSpec

LINEAR_ESTIMATORS = ("grpo", "rloo")
FORWARDS = ("logprob", "logprob_response")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def algo_refusal(algo: AlgoSpec) -> str | None:
    """Why `algo`'s gradient is not linear in a per-row scalar advantage, or None."""
    if algo.name not in LINEAR_ESTIMATORS:
        why = {
            "ppo": "per-token GAE advantages from a critic",
            "reinforce_plus_plus_baseline": "advantages whitened over the whole batch",
        }.get(algo.name, "its advantages")
        return (
            f"algo.name={algo.name}: {why} are not a scalar of the row's own group's "
            "rewards (early backward covers grpo and rloo)"
        )
    if algo.kl_in_reward:
        return "algo.kl_in_reward: the KL penalty enters the advantages (a PPO option)"
    if algo.loss_agg_mode not in AGG_MODES:
        return f"algo.loss_agg_mode={algo.loss_agg_mode}: not a mode whose normaliser is known"
    # what backends/torch/early_backward.py's row terms are derived for
    if algo.loss_mode != "vanilla":
        return f"algo.loss_mode={algo.loss_mode}: the row terms take the per-token ratio"
    if algo.clip_ratio_low is not None or algo.clip_ratio_high is not None:
        return "algo.clip_ratio_low/high: the row terms check the clip_eps band"
    if algo.kl_coef and algo.kl_loss_type not in ("low_var_kl", "k3"):
        return f"algo.kl_loss_type={algo.kl_loss_type}: the row terms take k3's KL"
    if algo.rollout_correction.enabled:
        return "algo.rollout_correction: the row terms carry no rollout IS weight or rejection"
    return None


def early_backward_refusal(graph: Graph) -> str | None:
    """Why this graph's policy gradient is not linear in per-row advantages, or None."""
    losses = [op for op in graph if op.kind == "policy_loss"]
    if not losses:
        return "the graph has no policy_loss"
    decodes = [op for op in graph if op.kind in ("decode", "generate")]
    if len(decodes) != 1:
        return f"{len(decodes)} rollouts in the graph (one is planned for)"
    rollout_weights = decodes[0].inputs["weights"]
    made = graph.producers()
    for loss in losses:
        adv = made.get(loss.inputs["advantages"])
        estimator = adv.attrs.get("estimator") if adv is not None else None
        if estimator not in LINEAR_ESTIMATORS:
            where = f"'{adv.name}'" if adv is not None else "an external value"
            return (
                f"'{loss.name}' reads advantages from {where} (estimator {estimator}): not one "
                "scalar per row of its group's rewards"
            )
        forward = _forward(graph, made, loss)
        if forward is None:
            return f"'{loss.name}': its logprobs come from no training forward"
        w = forward.inputs["weights"]
        reads, decoded = graph.values[w].version, graph.values[rollout_weights].version
        if w != rollout_weights or reads != decoded:
            return (
                f"'{forward.name}' reads {reads}, the rollout decoded with {decoded}: a "
                "later update, whose clipped ratio makes a row's gradient depend on the "
                "sign of its advantage"
            )
    return None


def _forward(graph: Graph, made: dict[str, Op], loss: Op) -> Op | None:
    op = made.get(loss.inputs["logprobs"])
    if op is None or op.kind not in FORWARDS or op.phase is not Phase.TRAIN:
        return None
    return op
