"""Write your own RL algorithm as a graph: GRPO whose reward adds a learned reward model
to the rule reward. Builds the step verl-style, lints it, runs the dedup passes and prints
the ops of each phase before and after (with the rows each prefix op processes).

    python examples/custom_algorithm.py [--model qwen2_5_vl_7b] [--workload video]
"""

from __future__ import annotations

import argparse

from rollplex.graph import Graph, Phase, StepBuilder, ValueKind, lint
from rollplex.graph.passes import DEDUP_PASSES, SPLIT_ONLY, run_passes
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ModelSpec, WorkloadSpec


def build_grpo_with_reward_model(
    model: ModelSpec, workload: WorkloadSpec, algo: AlgoSpec, rm_coef: float = 0.5
) -> Graph:
    b = StepBuilder(model, workload)
    g = workload.group_size
    policy, ref, rm = b.weights("policy"), b.weights("ref"), b.weights("rm")
    adam = b.optimizer_state(policy)
    prompts = b.prompts()

    with b.phase(Phase.ROLLOUT):
        responses, old_logprobs = b.rollout(prompts, policy, g)
        rule = b.reward(responses, prompts.answers, group_size=g)

    # Frozen scorers, written per sample as verl runs them; the passes share their prefix.
    with b.phase(Phase.REFERENCE):
        pixels, text = b.expand(prompts.pixels, g), b.expand(prompts.text, g)
        rm_feats = b.vision_encode(pixels, b.vision_weights(rm))
        learned = b.reward(responses, None, g, features=rm_feats, text=text, weights=rm)
        rewards = b.op(  # any registered op kind works through the generic `op`
            "combine_rewards",
            {"rewards_0": rule, "rewards_1": learned},
            {"rewards": ((b.rows(rule),), "float32", ValueKind.ACTIVATION)},
            coefs=[1.0, rm_coef],
        )["rewards"]
        advantages = b.advantage(rewards, "grpo", group_size=g)
        ref_logprobs = b.per_sample_logprob(prompts, responses, ref, g)["logprobs"]

    with b.phase(Phase.TRAIN):
        actor = b.per_sample_logprob(prompts, responses, policy, g, train=True)
        loss = b.policy_loss(
            actor["logprobs"],
            old_logprobs,
            advantages,
            ref_logprobs,
            clip_eps=algo.clip_eps,
            kl_coef=algo.kl_coef,
        )
        grads = b.backward(loss, policy, [actor["saved"]])

    with b.phase(Phase.UPDATE):
        new_policy, _ = b.optimizer_step(policy, grads, adam)
        b.weight_sync(new_policy)
    return b.graph  # b.build() would lint; done explicitly below


ROWS_PORT = {"vision_encode": "pixels", "logprob_prefix": "features"}  # prefix ops


def prefix_rows(graph: Graph) -> int:
    """Rows through the response-independent ops that the passes deduplicate."""
    return sum(
        graph.values[op.inputs[ROWS_PORT[op.kind]]].shape[0] for op in graph if op.kind in ROWS_PORT
    )


def show(title: str, graph: Graph) -> None:
    print(f"{title}: {len(graph)} ops")
    for phase in Phase:
        ops = [
            f"{op.kind}[{graph.values[op.inputs[ROWS_PORT[op.kind]]].shape[0]}]"
            if op.kind in ROWS_PORT
            else op.kind
            for op in graph.phase_ops(phase)
        ]
        print(f"  {phase.value:<9} ({len(ops):2}) {' '.join(ops)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2_5_vl_7b", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--workload", default="video", choices=sorted(WORKLOAD_PRESETS))
    args = parser.parse_args()
    workload = WORKLOAD_PRESETS[args.workload]
    graph = lint(build_grpo_with_reward_model(MODEL_PRESETS[args.model], workload, AlgoSpec()))
    print(f"lint ok: {graph}")
    show("before passes (verl-style)", graph)
    split, _ = run_passes(graph, SPLIT_ONLY)
    deduped, records = run_passes(graph, DEDUP_PASSES)
    print("passes:", ", ".join(f"{r.name}={'changed' if r.changed else 'no-op'}" for r in records))
    show("after DEDUP_PASSES", deduped)
    print(
        f"prefix rows (vision_encode + logprob_prefix): {prefix_rows(split)} per-sample -> "
        f"{prefix_rows(deduped)} deduplicated (N={workload.prompts_per_step}, "
        f"G={workload.group_size})"
    )


if __name__ == "__main__":
    main()
