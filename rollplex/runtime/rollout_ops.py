"""The dispatch's rollout side: decode sessions, engine prompts, weight syncs, residency.

Whatever the rollout role, these ops talk to it through `RolloutRole` alone: `decode` /
`generate` (segment k of n of one decode session, bit-identical to one decode), `ride` (a
trainer prefix chunk on the next decode step), `weight_sync` (alias or in-place load),
`residency` (sleep/wake), and `generate` outside any plan for evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch

from rollplex.backends.base import BackendError, Chunk, Sampling
from rollplex.data.prompts import PromptBatch
from rollplex.graph.ir import Op
from rollplex.runtime.dispatch_view import DispatchView

log = logging.getLogger(__name__)
# A piggybacked chunk whose decode stopped before its window (short answers): the same
# result as run alone, only not overlapped; the run log says so at DEBUG, not as a warning.
RAN_ALONE = "its rows ran alone"


def forced_lengths(dist: Any, rows: int, cap: int, seed: int, step: int) -> tuple[int, ...]:
    """One length per row drawn from `dist` (a ResponseLengthSpec) by its quantiles, capped
    at `cap`: a function of (seed, step, row), so every schedule of a run sees the same."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    u = torch.rand(rows, generator=gen, dtype=torch.float64).clamp(1e-6, 1 - 1e-6)
    return tuple(min(cap, max(1, round(dist.quantile(float(q))))) for q in u)


class RolloutOps:
    def __init__(self, dispatch: DispatchView) -> None:
        self.d = dispatch
        self.live: Any = None  # the decode session in flight: what piggybacked rows ride

    @property
    def rollout(self) -> Any:
        return self.d.rollout

    def check_weights(self, op: Op, weights: Any) -> None:
        if self.rollout.weights_version != weights.name:
            raise BackendError(
                f"'{op.name}' reads {weights.name} but the rollout holds "
                f"{self.rollout.weights_version}: a weight_sync is missing"
            )

    def decode(self, op: Op, x: dict[str, Any], chunk: Chunk, carry: dict[str, Any]):
        d = self.d
        self.check_weights(op, x["weights"])
        if chunk.index == 0:
            prefix = x["kv"] if op.kind == "decode" else self._engine_prompts(op, x)
            group = op.attrs["group_size"]
            start = self.rollout.start_decode
            if "kept" in op.outputs:  # decode once: the training response forward too
                start = self.rollout.start_decode_kept
            carry["session"] = self.live = start(
                prefix, group, self._sampling(prefix.rows * group), d._generator
            )
        session = carry.get("session")
        if session is None:
            raise BackendError(f"'{op.name}' segment {chunk.index} has no session")
        r = d.sampling.max_new_tokens
        share = r * (chunk.index + 1) // chunk.count - r * chunk.index // chunk.count
        session.advance(None if chunk.last else share)
        if not chunk.last:
            return {}
        session = carry.pop("session")
        self.live = None
        responses, logprobs = session.result()
        if op.kind == "generate":
            self._check_engine_prompts(op, session, x["text"], op.attrs["group_size"])
        lengths = responses.lengths.float()
        d.metrics["response_length"] = lengths.mean()
        # verl's response_length/clip_ratio: responses that ran to the cap (truncated,
        # unless the cap's last token was their eos)
        d.metrics["response_clip_ratio"] = (lengths >= d.sampling.max_new_tokens).float().mean()
        if logprobs is not None and not self.rollout.capabilities.scaled_logprobs:
            logprobs = None  # not of the distribution the trainer scores: not old logprobs
        if "kept" in op.outputs:
            return {"responses": responses, "logprobs": logprobs, "kept": session.kept()}
        return {"responses": responses, "logprobs": logprobs}

    def ride(
        self, op: Op, x: dict[str, Any], head: bool, micro_batches: int = 1
    ) -> tuple[dict[str, Any] | None, str]:
        """`op`'s prefix rows ride the live decode's next step: (its outputs, "") or, where
        they cannot, (None, why) and the caller runs them separately; a training prefix's
        backward recomputes them in `micro_batches` ranges. The rows must read the weights
        version the decode reads (what makes one GEMM right for both): a mismatch is a plan
        or weight-sync defect and is refused."""
        role = self.d.role(op)
        where = f"'{op.name}' was planned to ride the decode but ran separately"
        if op.kind != "logprob_prefix":
            return None, f"{where}: only a logprob_prefix runs the decoder's GEMMs"
        if self.live is None:
            return None, f"{where}: no decode was in flight"
        version = x["weights"].name
        if version != self.rollout.weights_version:
            raise BackendError(
                f"'{op.name}' would ride the decode with {version} but the decode reads "
                f"{self.rollout.weights_version}: piggybacked rows need the same weights"
            )
        prepare = getattr(role, "ride_rows", None)
        rows = prepare(x["features"], x["text"]) if prepare else None
        if rows is None:
            return None, f"{where}: {type(role).__name__} cannot prepare rows to ride"
        ridden = self.live.ride(rows)
        if ridden is None:
            return None, f"{where}: the {type(self.rollout).__name__} decode cannot host rows"
        state, saved = role.attach_ridden(ridden, x["features"], head, micro_batches)
        out = {"kv": state, "saved": saved} if "saved" in op.outputs else {"kv": state}
        if getattr(ridden, "alone", False):  # every row stopped before the planned window
            return out, f"'{op.name}' found the decode finished: {RAN_ALONE}"
        return out, ""

    def _sampling(self, rows: int) -> Sampling:
        """The step's sampling, with forced lengths when the run asks for them."""
        d = self.d
        dist = d.config.forced_lengths
        if dist is None:
            return d.sampling
        cap = d.sampling.max_new_tokens
        return dataclasses.replace(
            d.sampling, lengths=forced_lengths(dist, rows, cap, d.config.seed, d._step)
        )

    def _engine_prompts(self, op: Op, x: dict[str, Any]) -> Any:
        """`generate`: the engine takes the prompts' raw media and token ids and runs vision
        and prefill itself (cached across the G samples and across steps)."""
        media = x["pixels"]
        if self.rollout.capabilities.fused_prefix:
            inputs = self.d._inputs
            media = getattr(inputs, "media", None) or getattr(inputs, "samples", None)
        if media is None:
            raise BackendError(
                f"'{op.name}': {type(self.rollout).__name__} reads the prompts' raw images, "
                "but the step inputs carry no media (StepInputs.media)"
            )
        return self.rollout.prefix_prefill(self.rollout.vision_encode(media), x["text"])

    def _check_engine_prompts(self, op: Op, session: Any, text: Any, group: int) -> None:
        """The engine expands each image itself, with its folder's processor: its prompts
        must be as long as the ones the trainer scores, or the samples answer other prompts."""
        seen = getattr(session, "prompt_lengths", None)
        if seen is None or not hasattr(text, "lengths"):
            return
        ours = text.lengths.repeat_interleave(group).tolist()
        if list(seen) != ours:
            raise BackendError(
                f"'{op.name}': the engine's prompts have {list(seen)} tokens, the trainer's "
                f"{ours}: its image processor resizes differently from the prompt renderer "
                "(max_pixels); render prompts with the model folder's processor settings"
            )

    def weight_sync(self, op: Op, x: dict[str, Any]) -> dict[str, Any]:
        """The trainer's weights into the rollout: an alias for a colocated torch rollout,
        an in-place engine load (checkpoint tensor names, caches reset) for vLLM."""
        mode = op.attrs.get("mode", "alias")
        if mode == "alias" and self.rollout.capabilities.weights_layout in ("engine", "replica"):
            raise BackendError(
                f"'{op.name}' syncs by alias, but {type(self.rollout).__name__} holds its own "
                "copy: plan with the rollout's capabilities (weight_sync mode 'load')"
            )
        self.rollout.load_weights(self.d.trainer.live_weights())
        return {"weights": x["weights"]}

    def residency(self, action: Any) -> None:
        """The plan's sleep/wake of the rollout engine, for a role that can sleep; its
        time is a step metric (`engine_sleep_s`, `engine_wake_s`)."""
        if not self.rollout.capabilities.sleep_levels:
            return
        t0 = time.perf_counter()
        self.rollout.apply_residency(action)
        seconds = time.perf_counter() - t0
        key = f"engine_{action.kind}_s"
        self.d.metrics[key] = self.d.metrics.get(key, 0.0) + seconds
        log.debug("rollout engine: %s (%.3f s)", action, seconds)

    @torch.no_grad()
    def generate(
        self,
        batch: PromptBatch,
        max_new_tokens: int,
        temperature: float = 0.0,
        samples: Any = None,
        n: int = 1,
        top_p: float = 1.0,
    ):
        """`n` responses per prompt (rows grouped per prompt) from the rollout's current
        weights, outside any plan (evaluation): greedy by default. An engine rollout reads
        `samples`' raw media."""
        d = self.d
        st = d.config.model.special_tokens
        sampling = Sampling(max_new_tokens, temperature, top_p, st.eos_token_id, st.pad_token_id)
        if self.rollout.capabilities.fused_prefix:
            if samples is None:
                raise BackendError(
                    f"{type(self.rollout).__name__} generates from raw media: pass samples="
                )
            media = self.rollout.vision_encode(samples)
            prefix = self.rollout.prefix_prefill(media, batch)
            generator = 0
        else:
            batch = batch.to(d.device)
            features = self.rollout.vision_encode(d.roles.externals.pixels(batch))
            prefix = self.rollout.prefix_prefill(features, batch.text_only())
            generator = None
        session = self.rollout.start_decode(prefix, n, sampling, generator)
        session.advance(None)
        responses, _ = session.result()
        return responses
