"""A small DSL for writing RL steps as graphs.

    b = StepBuilder(model, workload); policy = b.weights("policy")
    with b.phase(Phase.ROLLOUT): feats = b.vision_encode(b.prompts().pixels, ...)
Each helper adds one op, names its outputs `<op>.<port>`, derives shapes from the specs and
stamps one weights version (a label: the on-policy lint reads `lineage`); `build()` lints.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, Op, Phase, Value, ValueKind, version_model
from rollplex.graph.schema import get_kind
from rollplex.specs import ModelSpec, WorkloadSpec

K = ValueKind


@dataclass(slots=True, frozen=True)
class Prompts:
    """Names of the external per-prompt inputs."""

    pixels: str
    text: str
    answers: str


class StepBuilder:
    def __init__(self, model: ModelSpec, workload: WorkloadSpec, policy_model: str = "policy"):
        self.model, self.workload = model, workload
        self.graph = Graph()
        self._phase: Phase | None = None
        self._policy = policy_model
        v = model.vision
        self.visual_tokens = workload.visual_tokens(v)
        self.patches = workload.patches(v)
        self.prefix_tokens = workload.prefix_tokens(v)
        self.max_response = workload.response_length.max

    # -- external inputs ----------------------------------------------------------------
    def weights(self, model: str, version: int = 0, include_vision: bool | None = None) -> str:
        """External weights of one model (`<model>@<version>`). The vision tower is kept in
        a separate shared `vision` value when it is frozen, so phases can share features."""
        if include_vision is None:
            include_vision = self.model.trainable_vision
        params = self.model.llm_param_count()
        if include_vision:
            params += self.model.vision.param_count()
        return self._external(
            f"{model}.weights", (params,), self.model.dtype, K.WEIGHTS, f"{model}@{version}"
        )

    def vision_weights(self, weights: str) -> str:
        """The weights a vision_encode reads: the model's own when the tower trains,
        else the one frozen tower every model shares."""
        if self.model.trainable_vision:
            return weights
        name = "vision.weights"
        if name not in self.graph.values:
            self._external(
                name, (self.model.vision.param_count(),), self.model.dtype, K.WEIGHTS, "vision@0"
            )
        return name

    def optimizer_state(self, weights: str) -> str:
        w = self.graph.values[weights]
        return self._external(
            f"{version_model(w.version)}.adam",
            (w.shape[0], 3),
            "float32",
            K.OPTIMIZER_STATE,
            w.version,
        )

    def prompts(self) -> Prompts:
        n = self.workload.prompts_per_step
        dt = self.model.dtype
        return Prompts(
            pixels=self._external(
                "prompts.pixels",
                (n, *self.workload.grid(self.model.vision), self.model.vision.patch_dim),
                dt,
                K.HOST_DATA,
            ),
            text=self._external(
                "prompts.text", (n, self.workload.text_tokens), "int64", K.HOST_DATA
            ),
            answers=self._external("prompts.answers", (n, 1), "int64", K.HOST_DATA),
        )

    @contextmanager
    def phase(self, phase: Phase | str) -> Iterator[None]:
        prev, self._phase = self._phase, Phase(phase)
        try:
            yield
        finally:
            self._phase = prev

    # -- the generic op -----------------------------------------------------------------
    def op(
        self,
        kind: str,
        inputs: dict[str, str],
        outputs: dict[str, tuple[tuple[int, ...], str, ValueKind]],
        name: str | None = None,
        **attrs: Any,
    ) -> dict[str, str]:
        """Add an op; `outputs` maps port -> (shape, dtype, kind). Returns port -> value."""
        if self._phase is None:
            raise RuntimeError(f"op '{name or kind}' added outside a `with builder.phase(...)`")
        spec = get_kind(kind)
        name = name or self._unique(f"{self._phase}.{kind}")
        version = self._version_of(inputs)
        out_names = {}
        for port, (shape, dtype, vkind) in outputs.items():
            out_version = version
            if kind == "optimizer_step":  # new weights and state: the next version
                model, n = self.graph.values[inputs["weights"]].version.split("@")
                out_version = f"{model}@{int(n) + 1}"
            vname = f"{name}.{port}"
            self.graph.add_value(Value(vname, tuple(shape), dtype, vkind, out_version))
            out_names[port] = vname
        self.graph.add_op(
            Op(name, kind, self._phase, dict(inputs), out_names, {**spec.attrs, **attrs})
        )
        return out_names

    def build(self) -> Graph:
        return lint(self.graph)

    # -- typed helpers ------------------------------------------------------------------
    def _act(self, *shape: int) -> tuple[tuple[int, ...], str, ValueKind]:
        return tuple(shape), self.model.dtype, K.ACTIVATION

    def _kv(self, rows: int, tokens: int, kind: ValueKind = K.KV_CACHE):
        m = self.model
        return (m.num_layers, 2, rows, tokens, m.kv_dim), m.dtype, kind

    def _saved(self, rows: int, tokens: int, kind: ValueKind):
        # Activation checkpointing keeps each layer's input hidden state per token.
        m = self.model
        return (m.num_layers, rows, tokens, m.hidden_size), m.dtype, kind

    def rows(self, value: str) -> int:
        return self.graph.values[value].shape[0]

    def expand(self, x: str, group_size: int, name: str | None = None) -> str:
        v = self.graph.values[x]
        shape = (v.shape[0] * group_size, *v.shape[1:])
        return self.op(
            "expand_group", {"x": x}, {"y": (shape, v.dtype, v.kind)}, name, group_size=group_size
        )["y"]

    def select_rows(self, x: str, lo: int, hi: int, name: str | None = None) -> str:
        """Rows [lo, hi) of a row-wise value: a PPO mini-batch's share of it."""
        v = self.graph.values[x]
        out = ((hi - lo, *v.shape[1:]), v.dtype, v.kind)
        rows = v.shape[0]
        return self.op("select_rows", {"x": x}, {"y": out}, name, lo=lo, hi=hi, rows=rows)["y"]

    def select_prompts(self, prompts: Prompts, lo: int, hi: int, tag: str) -> Prompts:
        """Prompt rows [lo, hi) (pixels and text; the answers stay whole, nothing in a
        training update reads them)."""
        return Prompts(
            pixels=self.select_rows(prompts.pixels, lo, hi, f"{self._phase}.{tag}.pixels"),
            text=self.select_rows(prompts.text, lo, hi, f"{self._phase}.{tag}.text"),
            answers=prompts.answers,
        )

    def rollout(self, prompts: Prompts, weights: str, group_size: int) -> tuple[str, str]:
        """Vision, prefix prefill and decode of `group_size` responses per prompt:
        returns (responses, their logprobs)."""
        feats = self.vision_encode(prompts.pixels, self.vision_weights(weights))
        kv = self.prefix_prefill(feats, prompts.text, weights)
        return self.decode(kv, weights, group_size=group_size)

    def per_sample_logprob(
        self,
        prompts: Prompts,
        responses: str,
        weights: str,
        group_size: int,
        train: bool = False,
        head: str = "lm",
        name: str | None = None,
        live: str | None = None,
    ) -> dict[str, str]:
        """Score responses as verl does: each prompt repeated per sample, then vision and a
        full logprob. The dedup passes turn the repeats into one prefix per prompt. `live`
        (its advantages): rows whose group's are all 0 are not trained, or not scored
        (algo.skip_zero_advantage)."""
        pixels = self.expand(
            prompts.pixels, group_size, self._unique(f"{self._phase}.expand_pixels")
        )
        text = self.expand(prompts.text, group_size, self._unique(f"{self._phase}.expand_text"))
        feats = self.vision_encode(
            pixels, self.vision_weights(weights), f"{name}_vision_encode" if name else None
        )
        return self.logprob(
            feats, text, responses, weights, train=train, name=name, head=head, live=live
        )

    def vision_encode(self, pixels: str, weights: str, name: str | None = None) -> str:
        out = self._act(self.rows(pixels), self.visual_tokens, self.model.hidden_size)
        return self.op(
            "vision_encode", {"pixels": pixels, "weights": weights}, {"features": out}, name
        )["features"]

    def prefix_prefill(self, features: str, text: str, weights: str, name: str | None = None):
        kv = self._kv(self.rows(features), self.prefix_tokens)
        return self.op(
            "prefix_prefill",
            {"features": features, "text": text, "weights": weights},
            {"kv": kv},
            name,
        )["kv"]

    def decode(
        self, kv: str, weights: str, group_size: int, name: str | None = None
    ) -> tuple[str, str]:
        s = self.graph.values[kv].shape[2] * group_size
        out = self.op(
            "decode",
            {"kv": kv, "weights": weights},
            {
                "responses": ((s, self.max_response), "int64", K.ACTIVATION),
                "logprobs": ((s, self.max_response), "float32", K.ACTIVATION),
            },
            name,
            group_size=group_size,
        )
        return out["responses"], out["logprobs"]

    def logprob(
        self,
        features: str,
        text: str,
        responses: str,
        weights: str,
        train: bool = False,
        name: str | None = None,
        head: str = "lm",
        live: str | None = None,
    ) -> dict[str, str]:
        s = self.rows(responses)
        outs = {"logprobs": ((s, self.max_response), "float32", K.ACTIVATION)}
        if train:  # kept for backward: the whole sequence, prefix included
            outs["saved"] = self._saved(s, self.prefix_tokens + self.max_response, K.ACTIVATION)
        ins = {"features": features, "text": text, "responses": responses, "weights": weights}
        if live is not None:
            ins["advantages"] = live
        return self.op(
            "logprob",
            ins,
            outs,
            name,
            head=head,
            kv_layout=(self.model.num_layers, self.model.kv_dim),
        )

    def reward(
        self,
        responses: str,
        answers: str | None,
        group_size: int,
        name: str | None = None,
        **extra: str,
    ) -> str:
        """A rule reward reads `answers`; a learned reward model passes `answers=None` and
        its `weights=`, `features=`, `text=` as extra ports."""
        out = ((self.rows(responses),), "float32", K.ACTIVATION)
        ins = {"responses": responses} | ({"answers": answers} if answers else {})
        return self.op(
            "reward",
            ins | extra,
            {"rewards": out},
            name,
            group_size=group_size,
        )["rewards"]

    def advantage(
        self,
        rewards: str,
        estimator: str,
        group_size: int,
        values: str | None = None,
        name: str | None = None,
        responses: str | None = None,
    ) -> str:
        ins = {"rewards": rewards} | ({"values": values} if values else {})
        ins |= {"responses": responses} if responses else {}
        out = ((self.rows(rewards),), "float32", K.ACTIVATION)
        return self.op(
            "advantage", ins, {"advantages": out}, name, estimator=estimator, group_size=group_size
        )["advantages"]

    def gae(
        self,
        rewards: str,
        values: str,
        gamma: float,
        lam: float,
        name: str | None = None,
        kl: tuple[str, str, float] | None = None,
    ) -> tuple[str, str]:
        """Per-token GAE advantages and the critic's targets (returns = advantages + values).
        `kl=(old_logprobs, ref_logprobs, coef)` puts a KL penalty in the token rewards."""
        out = ((self.rows(rewards), self.max_response), "float32", K.ACTIVATION)
        ins = {"rewards": rewards, "values": values}
        attrs = {}
        if kl is not None:
            ins |= {"old_logprobs": kl[0], "ref_logprobs": kl[1]}
            attrs["kl_coef"] = kl[2]
        outs = self.op(
            "advantage",
            ins,
            {"advantages": out, "returns": out},
            name,
            estimator="gae",
            gamma=gamma,
            lam=lam,
            **attrs,
        )
        return outs["advantages"], outs["returns"]

    def policy_loss(
        self,
        logprobs: str,
        old_logprobs: str | None,
        advantages: str,
        ref_logprobs: str | None = None,
        name: str | None = None,
        rollout_logprobs: str | None = None,
        **attrs,
    ) -> str:
        """`old_logprobs` None: the trainer's own, detached (one on-policy update)."""
        ins = {"logprobs": logprobs, "advantages": advantages}
        for port, value in (
            ("old_logprobs", old_logprobs),
            ("ref_logprobs", ref_logprobs),
            ("rollout_logprobs", rollout_logprobs),
        ):
            if value:
                ins[port] = value
        return self.op("policy_loss", ins, {"loss": ((), "float32", K.ACTIVATION)}, name, **attrs)[
            "loss"
        ]

    def value_loss(
        self,
        values: str,
        returns: str,
        old_values: str | None = None,
        name: str | None = None,
        **attrs,
    ) -> str:
        ins = {"values": values, "returns": returns}
        if old_values:
            ins["old_values"] = old_values
        return self.op("value_loss", ins, {"loss": ((), "float32", K.ACTIVATION)}, name, **attrs)[
            "loss"
        ]

    def backward(self, loss: str, weights: str, saved: list[str], name: str | None = None):
        w = self.graph.values[weights]
        ins = {"loss": loss, "weights": weights} | {f"saved_{i}": s for i, s in enumerate(saved)}
        # float32, as FSDP2's float32 shards hold them; a trainer that leaves them in the
        # compute dtype (the torch trainer) says so to the planner (planner/capabilities.py)
        return self.op("backward", ins, {"grads": (w.shape, "float32", K.GRAD)}, name)["grads"]

    def optimizer_step(
        self, weights: str, grads: str, state: str, name: str | None = None
    ) -> tuple[str, str]:
        w, st = self.graph.values[weights], self.graph.values[state]
        out = self.op(
            "optimizer_step",
            {"weights": weights, "grads": grads, "state": state},
            {
                "weights": (w.shape, w.dtype, K.WEIGHTS),
                "state": (st.shape, st.dtype, K.OPTIMIZER_STATE),
            },
            name,
        )
        return out["weights"], out["state"]

    def weight_sync(self, weights: str, name: str | None = None, mode: str = "alias") -> str:
        w = self.graph.values[weights]
        return self.op(
            "weight_sync",
            {"weights": weights},
            {"weights": (w.shape, w.dtype, K.WEIGHTS)},
            name,
            mode=mode,
        )["weights"]

    # -- internals ----------------------------------------------------------------------
    def _external(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: str,
        kind: ValueKind,
        version: str | None = None,
    ) -> str:
        self.graph.add_value(Value(name, shape, dtype, kind, version, external=True))
        return name

    def _unique(self, base: str) -> str:
        if base not in self.graph.ops:
            return base
        i = 1
        while f"{base}_{i}" in self.graph.ops:
            i += 1
        return f"{base}_{i}"

    def _version_of(self, inputs: dict[str, str]) -> str | None:
        """The stamp: policy data first; then any weights read; else the inputs' version.
        A label only (lint does not trust it; see the module docstring)."""
        vals = [self.graph.values[v] for v in inputs.values()]
        versions = [v.version for v in vals if v.version]
        for ver in versions:
            if version_model(ver) == self._policy:
                return ver
        for v in vals:
            if v.kind is K.WEIGHTS and v.version:
                return v.version
        return versions[0] if versions else None
