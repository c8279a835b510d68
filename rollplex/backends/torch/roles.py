"""The rollout and reference roles on transformers modules (the trainer is trainer.py), and
what all three share.

Which parameters train follows the graph: with a frozen vision tower its features are shared
across phases (`reuse_across_phases`), so the whole `model.visual` (merger included) stays
frozen unless the spec trains it, and the reference reads the policy's tower.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from rollplex.backends.base import (
    BackendError,
    CheckpointWeights,
    DecodeSession,
    LiveWeights,
    ReferenceScorer,
    RolloutRole,
    Sampling,
    WeightsSource,
    version_name,
)
from rollplex.backends.torch.activations import SavedActivations
from rollplex.backends.torch.decode import DecodeSession as TorchDecodeSession
from rollplex.backends.torch.exported_prefix import ExportedPrefix, prefill_exported
from rollplex.backends.torch.full_forward import features_full_logprobs
from rollplex.backends.torch.logprob import response_logprobs, response_mask
from rollplex.backends.torch.model import load_model
from rollplex.backends.torch.row_ranges import live_units, scored_live_runs
from rollplex.backends.torch.rows import merge_chunks, select_rows
from rollplex.backends.torch.trim import trimmed
from rollplex.backends.torch.values import Features, Pixels, Responses, TokenLogprobs
from rollplex.data.prompts import PromptBatch
from rollplex.engine.decoded import DecodedOutputs
from rollplex.engine.prefix import Model, PrefixState, prefix_forward
from rollplex.engine.prefix import vision_encode as encode
from rollplex.engine.riders import RiddenPrefix, RiderRows
from rollplex.engine.session import DecodeEngine, EngineSession
from rollplex.specs import ModelSpec
from rollplex.specs.roles import TORCH_ROLLOUT, TORCH_SCORER, RoleCapabilities
from rollplex.specs.torch_engine import TorchEngineSpec


def llm_params(model: Model) -> tuple[torch.nn.Parameter, ...]:
    """The language model and its head: what `<model>.weights` names in the graph."""
    lm = list(model.model.language_model.parameters())
    head = [p for p in model.lm_head.parameters() if all(p is not q for q in lm)]
    return tuple(lm + head)


def vision_params(model: Model) -> tuple[torch.nn.Parameter, ...]:
    return tuple(model.model.visual.parameters())


def weights_params(model: Model, spec: ModelSpec) -> tuple[torch.nn.Parameter, ...]:
    """What `<model>.weights` names: the LLM, plus the tower when it trains (with a frozen
    tower the graph has a separate `vision.weights`)."""
    return llm_params(model) + (vision_params(model) if spec.trainable_vision else ())


def freeze_for_graph(model: Model, spec: ModelSpec) -> None:
    for p in vision_params(model):
        p.requires_grad_(spec.trainable_vision)
    for p in llm_params(model):
        p.requires_grad_(True)


@contextmanager
def capture_saved(saved: SavedActivations | None = None) -> Iterator[SavedActivations]:
    """Collect what autograd saves for backward inside the block (into `saved`, or a new
    one)."""
    saved = SavedActivations() if saved is None else saved

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


def features_of(model: Model, pixels: Pixels) -> Features:
    """Merged features of every prompt's visuals in one tower call; images and video
    frames alike (a grid with t > 1 is a video)."""
    return Features(encode(model, pixels.values, pixels.grid), feature_tokens(model, pixels))


def feature_tokens(model: Model, pixels: Pixels) -> list[int]:
    """Each prompt's merged visual tokens: its patches over the merger's window."""
    merge = model.config.vision_config.spatial_merge_size**2
    return [int(n.sum()) for n in (pixels.grid.prod(-1) // merge).split(pixels.counts)]


def masked_logprobs(values: torch.Tensor, responses: Responses) -> TokenLogprobs:
    return TokenLogprobs(values, response_mask(responses.lengths, responses.tokens.shape[1]))


class TorchDecode(DecodeSession):
    """A decode session of the engine (engine/session.py) or of the eager loop (decode.py)."""

    def __init__(self, session: EngineSession | TorchDecodeSession, version: str = "") -> None:
        self.session, self.version = session, version

    def kept(self) -> DecodedOutputs:
        """The engine's kept layer outputs (decode once), stamped with the weights version
        that decoded them."""
        if not isinstance(self.session, EngineSession):
            raise BackendError("the eager decode loop keeps no layer outputs")
        try:
            out = self.session.kept()
        except RuntimeError as e:
            raise BackendError(str(e)) from e
        out.version = self.version
        return out

    def advance(self, steps: int | None = None) -> bool:
        return self.session.advance(steps)

    @property
    def steps_left(self) -> int:
        return self.session.steps_left

    def ride(self, rows: RiderRows) -> RiddenPrefix | None:
        """The engine hosts rows (engine/riders.py); the eager loop does not."""
        return self.session.ride(rows) if isinstance(self.session, EngineSession) else None

    def result(self) -> tuple[Responses, TokenLogprobs]:
        if isinstance(self.session, EngineSession):
            tokens, logprobs, lengths = self.session.result()
        else:
            out = self.session.result()
            tokens, logprobs, lengths = out.tokens, out.logprobs, out.lengths
        responses = Responses(tokens, lengths)
        return responses, masked_logprobs(logprobs, responses)

    def tensors(self) -> Iterator[torch.Tensor]:
        s = self.session
        if isinstance(s, EngineSession):
            yield from s.tensors()
            return
        yield from (s.tokens, s.logprobs, s.lengths, s.mask)
        if s.logits is not None:
            yield s.logits
            for k, v in [(layer.keys, layer.values) for layer in s.kv.layers]:
                yield from (k, v)


class TorchRollout(RolloutRole):
    """Rolls out with whatever weights it was last given: the trainer's module itself
    (colocated alias: no copy, and every in-place update shows at once) or a model folder."""

    capabilities: ClassVar[RoleCapabilities] = TORCH_ROLLOUT

    def __init__(
        self, spec: ModelSpec, device: torch.device, engine: TorchEngineSpec | None = None
    ) -> None:
        self.spec, self.device = spec, device
        self.engine = engine or TorchEngineSpec()
        self.model: Model | None = None
        self._version: str = ""
        self._engine: DecodeEngine | None = None  # static cache + graphs, kept across steps

    def load_weights(self, source: WeightsSource) -> str:
        if isinstance(source, LiveWeights):
            self.model = source.params.module  # alias the trainer's parameters
        elif isinstance(source, CheckpointWeights):
            self.model = load_model(source.folder, spec=self.spec).to(self.device)
        else:
            raise BackendError(f"unknown weights source {source!r}")
        self._version = version_name(source.model, source.version)
        return self._version

    @property
    def weights_version(self) -> str:
        return self._version

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_chunks(parts, self._model().lm_head)

    def _model(self) -> Model:
        if self.model is None:
            raise BackendError("rollout has no weights: call load_weights first")
        return self.model

    def vision_encode(self, pixels: Pixels) -> Features:
        with torch.no_grad():
            return features_of(self._model(), pixels)

    def prefix_prefill(
        self, features: Features, text: PromptBatch, head: bool = True
    ) -> PrefixState:
        return prefix_forward(self._model(), text, features.values, grad=False, head=head)

    def prefix_prefill_exported(
        self, features: Features, text: PromptBatch
    ) -> tuple[PrefixState, ExportedPrefix]:
        """The prefill that also keeps what the training prefix forward would
        (capabilities.activation_export, exported_prefix.py)."""
        return prefill_exported(self._model(), features.values, text, self._version)

    def start_decode(
        self, prefix: PrefixState, group_size: int, sampling: Sampling, generator: Any
    ) -> TorchDecode:
        return self._start(prefix, group_size, sampling, generator, keep=False)

    def start_decode_kept(
        self, prefix: PrefixState, group_size: int, sampling: Sampling, generator: Any
    ) -> TorchDecode:
        """A decode that keeps each layer's output of every fed token (decode once:
        engine/decoded.py), for the trainer's `attach_decoded`."""
        return self._start(prefix, group_size, sampling, generator, keep=True)

    def _start(
        self, prefix: PrefixState, group_size: int, sampling: Sampling, generator: Any, keep: bool
    ) -> TorchDecode:
        model = self._model()
        if self._engine is None or self._engine.model is not model:
            # buffers (and graphs) kept across steps, on CPU too: what the plan prices
            # (capabilities.TORCH_ROLLOUT.static_kv)
            e = self.engine
            self._engine = DecodeEngine(
                model,
                keep_workspace=True,
                attention=e.attention,
                compile=e.compile,
                fused_qkv=e.fused_qkv,
                skinny_gemm=e.skinny_gemm,
                split_kernel=e.split_kernel,
                split_gemm=e.split_gemm,
            )
        s = sampling
        return TorchDecode(
            self._engine.start(
                prefix,
                group_size,
                s.max_new_tokens,
                s.temperature,
                s.top_p,
                generator,
                s.eos_id,
                s.pad_id,
                s.lengths,
                keep_outputs=keep,
            ),
            self._version,
        )


class TorchReference(ReferenceScorer):
    """Scores with a frozen model; logprobs at the rollout's `temperature` (see logprob.py)."""

    capabilities: ClassVar[RoleCapabilities] = TORCH_SCORER

    def __init__(self, model: Model, temperature: float = 1.0) -> None:
        self.model, self.temperature = model, temperature

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_chunks(parts, self.model.lm_head)

    def vision_encode(self, pixels: Pixels) -> Features:
        with torch.no_grad():
            return features_of(self.model, pixels)

    def logprob_prefix(
        self, features: Features, text: PromptBatch, head: bool = True
    ) -> PrefixState:
        return prefix_forward(self.model, text, features.values, grad=False, head=head)

    def logprob_response(
        self,
        prefix: PrefixState,
        responses: Responses,
        group_size: int,
        advantages: torch.Tensor | None = None,
    ) -> TokenLogprobs:
        """With `advantages` (the old-logprob forward, skip_zero_advantage): the prompts
        whose groups' are all 0 are not scored; their rows hold 0."""
        if advantages is not None:
            live = live_units(advantages, prefix.rows, group_size)

            def part(lo: int, hi: int) -> TokenLogprobs:
                rows = select_rows(responses, lo * group_size, hi * group_size)
                return self.logprob_response(select_rows(prefix, lo, hi), rows, group_size)

            return scored_live_runs(live, group_size, responses, part)
        lengths, t, packed = responses.lengths, self.temperature, self.packed_responses

        def score(tokens: torch.Tensor) -> torch.Tensor:
            return response_logprobs(
                self.model, prefix, tokens, lengths, t, group_size, packed=packed
            )

        with torch.no_grad():  # each prompt's G responses share its prefix K/V (no expand)
            lp = trimmed(score, responses.tokens, lengths)  # to the rows' longest, not the cap
        return masked_logprobs(lp, responses)

    def logprob(
        self,
        features: Features,
        text: PromptBatch,
        responses: Responses,
        advantages: torch.Tensor | None = None,
    ) -> TokenLogprobs:
        """With `advantages`: the samples whose advantage is 0 are not scored (0 there)."""
        if advantages is not None:
            live = live_units(advantages, features.rows, 1)

            def part(lo: int, hi: int) -> TokenLogprobs:
                rows = select_rows(responses, lo, hi)
                return self.logprob(features.select(lo, hi), text.select(lo, hi), rows)

            return scored_live_runs(live, 1, responses, part)
        lengths, t, packed = responses.lengths, self.temperature, self.packed_responses

        def score(tokens: torch.Tensor) -> torch.Tensor:
            return features_full_logprobs(
                self.model, text, features.values, tokens, lengths, t, packed=packed
            )

        with torch.no_grad():  # its LM head to the rows' longest response, not the cap
            lp = trimmed(score, responses.tokens, lengths)
        return masked_logprobs(lp, responses)
