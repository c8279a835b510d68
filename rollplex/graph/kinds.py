"""The built-in op kinds of an RL step (schema only; costs live in `rollplex.ops.costs`)."""

from __future__ import annotations

from rollplex.graph.ir import Op
from rollplex.graph.ir import ValueKind as K
from rollplex.graph.schema import FLOAT, INT, OpKind, get_kind, port, register

_DATA = (K.HOST_DATA, K.ACTIVATION)
_ROWS3 = ("B", None, None)
_KV = (None, None, "B", None, None)  # (layers, 2, rows, tokens, kv_dim)
# a training forward's advantages (algo.skip_zero_advantage): it skips the rows of groups
# whose advantages are all 0 (an attached prefix: their prompts' replay)
_LIVE_ROWS = port(K.ACTIVATION, dtype=FLOAT, dims=("S",), optional=True)


def _grouped(rows: str, samples: str = "S"):
    def check(op, sym: dict[str, int]) -> str | None:
        g = op.attrs.get("group_size", 1)
        if rows in sym and samples in sym and sym[samples] != sym[rows] * g:
            return (
                f"{samples}={sym[samples]} samples must equal {rows}={sym[rows]} rows x "
                f"group_size={g}"
            )
        return None

    return check


def _one_coef_per_reward(op: Op, sym: dict[str, int]) -> str | None:
    n = sum(p == "rewards" or p.startswith("rewards_") for p in op.inputs)
    coefs = op.attrs.get("coefs")
    if n == 0:
        return "reads no rewards (wire rewards_0, rewards_1, ...)"
    if coefs is not None and len(coefs) != n:
        return f"has {n} rewards inputs but {len(coefs)} coefs"
    return None


register(
    OpKind(
        "vision_encode",
        "ViT over the patches of each row, then the 2x2 merger.",
        # pixels: (rows, t, h, w, patch_dim), the processor's grid of patches per prompt;
        # attention runs within each temporal patch, so the cost needs the layout.
        inputs={
            "pixels": port(*_DATA, dtype=FLOAT, dims=("B", None, None, None, None)),
            "weights": port(K.WEIGHTS),
            # the trainer's own encode for a skipping prefix (passes/skip_dead_prefix)
            "advantages": _LIVE_ROWS,
        },
        outputs={"features": port(K.ACTIVATION, dtype=FLOAT, dims=_ROWS3)},
        prefix=True,
    )
)
register(
    OpKind(
        "prefix_prefill",
        "Rollout prefill of visual + text prefix; leaves the prefix KV cache.",
        inputs={
            "features": port(K.ACTIVATION, dtype=FLOAT, dims=_ROWS3),
            "text": port(*_DATA, dtype=INT, dims=("B", None)),
            "weights": port(K.WEIGHTS),
        },
        outputs={
            "kv": port(K.KV_CACHE, dtype=FLOAT, dims=_KV),
            # what the training prefix forward would keep (graph/passes/prefill_once.py)
            "exported": port(K.BOUNDARY, dims=(None, "B"), optional=True),
        },
        prefix=True,
    )
)
register(
    OpKind(
        "decode",
        "Token-by-token sampling of group_size responses per prefix row.",
        inputs={"kv": port(K.KV_CACHE, dtype=FLOAT, dims=_KV), "weights": port(K.WEIGHTS)},
        outputs={
            "responses": port(K.ACTIVATION, dtype=INT, dims=("S", None)),
            "logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None)),
            # what the same weights' training response forward would keep: each layer's
            # output of every fed response token (graph/passes/decode_once.py)
            "kept": port(K.BOUNDARY, dims=(None, "S"), optional=True),
        },
        check=_grouped("B"),
        attrs={"group_size": 1},
    )
)
register(
    OpKind(
        "generate",
        "A whole rollout in one engine op: vision, prefill (prefix-cached across the group) "
        "and decode of group_size responses per prompt, for an engine that runs them itself "
        "(planner/capabilities.py plans it for a rollout with fused_prefix).",
        inputs={
            "pixels": port(*_DATA, dtype=FLOAT, dims=_ROWS3),
            "text": port(*_DATA, dtype=INT, dims=("B", None)),
            "weights": port(K.WEIGHTS),
            "vision_weights": port(K.WEIGHTS),
        },
        outputs={
            "responses": port(K.ACTIVATION, dtype=INT, dims=("S", None)),
            "logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None)),
        },
        check=_grouped("B"),
        attrs={"group_size": 1},
    )
)
register(
    OpKind(
        "logprob",
        "Full forward over prefix + response per sample (what verl runs).",
        inputs={
            "features": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None, None)),
            "text": port(*_DATA, dtype=INT, dims=("S", None)),
            "responses": port(K.ACTIVATION, dtype=INT, dims=("S", None)),
            "weights": port(K.WEIGHTS),
            "advantages": _LIVE_ROWS,
        },
        outputs={
            "logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None)),
            "saved": port(K.ACTIVATION, K.BOUNDARY, optional=True),
        },
        attrs={"head": "lm", "kv_layout": None},
    )
)
register(
    OpKind(
        "logprob_prefix",
        "Response-independent part of a logprob: forward over the prefix.",
        inputs={
            "features": port(K.ACTIVATION, dtype=FLOAT, dims=_ROWS3),
            "text": port(*_DATA, dtype=INT, dims=("B", None)),
            "weights": port(K.WEIGHTS),
            # the trainer's own forward skips dead groups' prompts (passes/skip_dead_prefix)
            "advantages": _LIVE_ROWS,
        },
        outputs={
            "kv": port(K.KV_CACHE, K.BOUNDARY, dtype=FLOAT, dims=_KV),
            "saved": port(K.BOUNDARY, dims=(None, "B"), optional=True),
            # a no-grad prefix forward (PPO's critic in the reference phase) that also keeps
            # what the same weights' training forward would (graph/passes/prefill_once.py)
            "exported": port(K.BOUNDARY, dims=(None, "B"), optional=True),
        },
        prefix=True,
        attrs={"head": "lm"},
    )
)
register(
    OpKind(
        "attach_prefix",
        "The training prefix from what a no-grad prefix forward of the same weights version "
        "exported (the rollout's prefill; PPO's critic in the reference phase): each layer's "
        "input and the prefix K/V. No forward runs; the backward recomputes each layer from its "
        "input, as a checkpointed forward's does (graph/passes/prefill_once.py).",
        inputs={
            "features": port(K.ACTIVATION, dtype=FLOAT, dims=_ROWS3),
            "text": port(*_DATA, dtype=INT, dims=("B", None)),
            "exported": port(K.BOUNDARY, dims=(None, "B")),
            "weights": port(K.WEIGHTS),
            "advantages": _LIVE_ROWS,
        },
        outputs={"kv": port(K.BOUNDARY, dtype=FLOAT, dims=_KV)},
        attrs={"head": "lm"},
    )
)
register(
    OpKind(
        "attach_response",
        "The training response forward from what the decode of the same weights version "
        "kept: each layer's output of every fed response token. No forward runs but the LM "
        "head's; the backward recomputes each layer from its input, as a checkpointed "
        "forward's does (graph/passes/decode_once.py).",
        inputs={
            "kv": port(K.KV_CACHE, K.BOUNDARY, dtype=FLOAT, dims=_KV),
            "responses": port(K.ACTIVATION, dtype=INT, dims=("S", None)),
            "kept": port(K.BOUNDARY, dims=(None, "S")),
            "weights": port(K.WEIGHTS),
            "advantages": _LIVE_ROWS,
        },
        outputs={"logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None))},
        check=_grouped("B"),
        attrs={"group_size": 1, "head": "lm"},
    )
)
register(
    OpKind(
        "logprob_response",
        "Response part of a logprob: attends to the cached prefix rows.",
        inputs={
            "kv": port(K.KV_CACHE, K.BOUNDARY, dtype=FLOAT, dims=_KV),
            "responses": port(K.ACTIVATION, dtype=INT, dims=("S", None)),
            "weights": port(K.WEIGHTS),
            "advantages": _LIVE_ROWS,
        },
        outputs={
            "logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None)),
            "saved": port(K.ACTIVATION, optional=True),
        },
        check=_grouped("B"),
        attrs={"group_size": 1, "head": "lm"},
    )
)
register(
    OpKind(
        "expand_group",
        "Repeat each prompt row group_size times (verl's repeat_interleave).",
        inputs={"x": port(*K, dims=("N",))},
        outputs={"y": port(*K, dims=("S",))},
        check=_grouped("N"),
        attrs={"group_size": 1},
    )
)


def _row_window(op: Op, sym: dict[str, int]) -> str | None:
    lo, hi = op.attrs.get("lo", 0), op.attrs.get("hi", 0)
    if not 0 <= lo < hi or ("N" in sym and hi > sym["N"]):
        return f"rows [{lo}, {hi}) are not a non-empty window of N={sym.get('N')} rows"
    if "M" in sym and sym["M"] != hi - lo:
        return f"M={sym['M']} rows out, but the window [{lo}, {hi}) holds {hi - lo}"
    return None


register(
    OpKind(
        "select_rows",
        "Rows [lo, hi) of a row-wise value: one PPO mini-batch of the step's batch.",
        inputs={"x": port(*_DATA, dims=("N",))},
        outputs={"y": port(*_DATA, dims=("M",))},
        check=_row_window,
        attrs={"lo": 0, "hi": 0, "rows": None},  # rows: the input's, whole batch
    )
)


register(
    OpKind(
        "reward",
        "Score each response: a rule against the answer, or a learned reward model.",
        inputs={
            "responses": port(K.ACTIVATION, dtype=INT, dims=("S", None)),
            "answers": port(*_DATA, dims=("N",), optional=True),
            "features": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None, None), optional=True),
            "text": port(*_DATA, dtype=INT, dims=("S", None), optional=True),
            "weights": port(K.WEIGHTS, optional=True),
        },
        outputs={"rewards": port(K.ACTIVATION, dtype=FLOAT, dims=("S",))},
        check=_grouped("N"),
        attrs={"group_size": 1},
    )
)
register(
    OpKind(
        "advantage",
        "Advantages from rewards: group-normalised (GRPO), leave-one-out, group-centred "
        "and whitened over the batch's tokens (REINFORCE++-baseline), or GAE.",
        inputs={
            "rewards": port(K.ACTIVATION, dtype=FLOAT, dims=("S",)),
            "values": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None), optional=True),
            # GAE with a KL penalty in the reward (verl's use_kl_in_reward).
            "old_logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None), optional=True),
            "ref_logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", None), optional=True),
            # REINFORCE++-baseline whitens over tokens: it reads each response's length
            "responses": port(K.ACTIVATION, dtype=INT, dims=("S", None), optional=True),
        },
        outputs={
            "advantages": port(K.ACTIVATION, dtype=FLOAT, dims=("S",)),
            # GAE also yields the critic's regression targets: advantages + values.
            "returns": port(K.ACTIVATION, dtype=FLOAT, dims=("S",), optional=True),
        },
        attrs={"estimator": "grpo", "group_size": 1},
    )
)
register(
    OpKind(
        "combine_rewards",
        "Weighted sum of per-sample rewards: a rule plus learned reward models.",
        inputs={"rewards": port(K.ACTIVATION, dtype=FLOAT, dims=("S",), optional=True)},
        outputs={"rewards": port(K.ACTIVATION, dtype=FLOAT, dims=("S",))},
        check=_one_coef_per_reward,
        variadic_inputs="rewards",
        attrs={"coefs": None},  # None: plain sum
    )
)
register(
    OpKind(
        "policy_loss",
        "Clipped policy-gradient loss with an optional KL to the reference.",
        inputs={
            "logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", "R")),
            # absent: the trainer's own logprobs, detached (one on-policy update)
            "old_logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", "R"), optional=True),
            "advantages": port(K.ACTIVATION, dtype=FLOAT, dims=("S",)),
            "ref_logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", "R"), optional=True),
            # the rollout engine's, for algo.rollout_correction's weights and rejection
            "rollout_logprobs": port(K.ACTIVATION, dtype=FLOAT, dims=("S", "R"), optional=True),
        },
        outputs={"loss": port(K.ACTIVATION, dtype=FLOAT, dims=())},
        attrs={"clip_eps": 0.2, "kl_coef": 0.0},
    )
)
register(
    OpKind(
        "value_loss",
        "Clipped value regression of a critic against returns.",
        inputs={
            "values": port(K.ACTIVATION, dtype=FLOAT, dims=("S", "R")),
            "returns": port(K.ACTIVATION, dtype=FLOAT, dims=("S",)),
            # The rollout-time values the clip is centred on.
            "old_values": port(K.ACTIVATION, dtype=FLOAT, dims=("S", "R"), optional=True),
        },
        outputs={"loss": port(K.ACTIVATION, dtype=FLOAT, dims=())},
        attrs={"clip_eps": 0.5},  # verl's critic.cliprange_value
    )
)
register(
    OpKind(
        "backward",
        "Gradients of a loss w.r.t. the weights, through the kept activations.",
        inputs={
            "loss": port(K.ACTIVATION, dtype=FLOAT, dims=()),
            "weights": port(K.WEIGHTS),
            "saved": port(K.ACTIVATION, K.BOUNDARY, optional=True),
        },
        outputs={"grads": port(K.GRAD)},
        variadic_inputs="saved",
    )
)
register(
    OpKind(
        "optimizer_step",
        "AdamW with fp32 master weights and moments; makes the next version.",
        inputs={
            "weights": port(K.WEIGHTS),
            "grads": port(K.GRAD),
            "state": port(K.OPTIMIZER_STATE),
        },
        outputs={"weights": port(K.WEIGHTS), "state": port(K.OPTIMIZER_STATE)},
    )
)
register(
    OpKind(
        "weight_sync",
        "Hand the updated weights to the rollout role (alias, reshard or copy).",
        inputs={"weights": port(K.WEIGHTS)},
        outputs={"weights": port(K.WEIGHTS)},
        attrs={"mode": "alias"},
    )
)


def skips_rows(op: Op) -> bool:
    """`op` is a forward given its rows' advantages (algo.skip_zero_advantage), to skip the
    rows of groups whose advantages are all 0."""
    return "advantages" in op.inputs and get_kind(op.kind).inputs.get("advantages") is _LIVE_ROWS
