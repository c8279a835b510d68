"""VllmRollout: the rollout role on an in-process vLLM engine.

    rollout.load_weights(trainer.live_weights())          # in place, caches reset
    session = rollout.start_decode(prompts, G, sampling, generator)
    while not session.advance(segment): ...               # other streams work in between
vLLM prefills and caches prompts itself (`fused_prefix`): no separate prefix work, no riders.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from rollplex.backends.base import (
    BackendError,
    LiveWeights,
    RolloutRole,
    Sampling,
    WeightsSource,
    version_name,
)
from rollplex.backends.vllm.decode import VllmDecode, step_seed
from rollplex.backends.vllm.engine import on_cpu, require_vllm, start_engine
from rollplex.backends.vllm.folder import check_model_folder, placeholder_ids
from rollplex.backends.vllm.prompts import VllmPrompts, build_prompts
from rollplex.backends.vllm.share import ON_CPU, SharedStorage
from rollplex.backends.vllm.weights import live_tensors, reload_in_place, reset_caches, tensors_of
from rollplex.data.prompt_media import Media
from rollplex.specs.roles import VLLM_ROLLOUT, VLLM_SHARED_ROLLOUT, RoleCapabilities
from rollplex.specs.vllm import VllmSpec

log = logging.getLogger(__name__)


class VllmRollout(RolloutRole):
    capabilities: ClassVar[RoleCapabilities] = VLLM_ROLLOUT

    def __init__(
        self,
        folder: str | Path,
        spec: VllmSpec | None = None,
        kv_cache_bytes: int | None = None,
        model: str = "policy",
        version: int = 0,
    ) -> None:
        """Start the engine on `folder` (its weights become `<model>@<version>`).
        `kv_cache_bytes` is the plan's KV budget for the rollout; it overrides the spec's.
        Raises ModelFolderError on an incomplete folder, then BackendUnavailable without
        vLLM, both before any engine starts."""
        self.spec = spec or VllmSpec()
        self.folder = check_model_folder(folder)
        self._pads = placeholder_ids(self.folder)
        require_vllm()
        self.llm = start_engine(self.folder, self.spec, kv_cache_bytes)
        self.cpu = on_cpu()
        self._version = version_name(model, version)
        self._asleep: int | None = None  # the level it was put to sleep at
        self._sleeping: set[str] = set()  # "weights", "kv_cache": what is not resident
        self.residency_seconds = {"sleep": 0.0, "wake": 0.0}
        self._session: VllmDecode | None = None
        self._cpu_sleep_logged = False
        self.last_update_seconds = 0.0
        self.shared: SharedStorage | None = None  # backend.vllm.weights=share

    # -- weights ----------------------------------------------------------------------------
    def share_storage(self, trainer: Any, spec: Any) -> SharedStorage:
        """Make `trainer`'s parameters views of the engine's tensors (`share.py`); from
        then on a live weight sync only loads the rebuilt tensors and resets the caches."""
        if self.cpu:
            raise BackendError(ON_CPU)
        (engine,) = self.llm.apply_model(lambda m: m)  # in-process: the model itself
        self.shared = SharedStorage(engine, trainer, spec)
        self.capabilities = VLLM_SHARED_ROLLOUT
        return self.shared

    def load_weights(self, source: WeightsSource, *, reset: bool = True) -> str:
        """Load `source` into the running engine in place (no disk round trip for live
        weights), then reset the prefix, multimodal and encoder caches. `reset=False` only
        serves the test that shows why the resets are needed. An engine sharing the
        trainer's storage loads only the rebuilt tensors of live weights."""
        self._awake("load weights", "weights")
        self._check_idle("load weights")
        t0 = time.perf_counter()
        if self.shared is not None and isinstance(source, LiveWeights):
            self.shared.sync()
            rebuilt = self.shared.rebuilt_tensors()
            if rebuilt:
                reload_in_place(self.llm, live_tensors(dict(rebuilt)), reset=False)
            if reset:
                reset_caches(self.llm)
        else:
            reload_in_place(self.llm, tensors_of(source), reset=reset)
        self.last_update_seconds = time.perf_counter() - t0
        self._version = version_name(source.model, source.version)
        return self._version

    @property
    def weights_version(self) -> str:
        return self._version

    # -- prefix: bookkeeping only (the engine encodes and prefills inside decode) -----------
    def vision_encode(self, pixels: Media | Sequence[Any]) -> Media:
        """The prompts' raw media: a `Media`, or data samples (their images and frames)."""
        if isinstance(pixels, Sequence) and all(hasattr(x, "images") for x in pixels):
            pixels = Media.of(pixels)
        if not isinstance(pixels, Media):
            raise BackendError(
                f"the vLLM rollout takes the prompts' images and frames (Media), not "
                f"{type(pixels).__name__}: vLLM runs the vision tower itself"
            )
        return pixels

    def prefix_prefill(self, features: Media, text: Any) -> VllmPrompts:
        return build_prompts(features, text, self._pads)

    # -- decode -----------------------------------------------------------------------------
    def start_decode(
        self, prefix: VllmPrompts, group_size: int, sampling: Sampling, generator: Any
    ) -> VllmDecode:
        """`generator`: the step's decode generator (or an int seed); each row's seed is
        drawn from it, so tokens are a function of (seed, step, row)."""
        self._awake("start a decode", "weights", "kv_cache")
        self._check_idle("start a decode")
        self._session = VllmDecode(
            self.llm,
            prefix,
            group_size,
            sampling,
            step_seed(generator),
            self.spec.return_logprobs,
            self.spec.seed,
            device=getattr(generator, "device", "cpu"),  # an int seed: host
        )
        return self._session

    def generate(
        self, media: Media, text: Any, group_size: int, sampling: Sampling, generator: Any
    ) -> tuple[Any, Any]:
        """The whole rollout in one call: (Responses, TokenLogprobs or None)."""
        session = self.start_decode(
            self.prefix_prefill(self.vision_encode(media), text), group_size, sampling, generator
        )
        session.advance()
        return session.result()

    def _check_idle(self, what: str) -> None:
        if self._session is not None and not self._session.finished:
            raise BackendError(f"cannot {what} while a decode session is unfinished")

    def shutdown(self) -> None:
        """Stop the engine and free what it holds; another engine can start in this process."""
        if self.llm is None:
            return
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        destroy_model_parallel()
        destroy_distributed_environment()

    # -- residency --------------------------------------------------------------------------
    def apply_residency(self, action: Any) -> None:
        """The plan's residency action (runtime/engine_residency.py): sleep or wake."""
        if action.kind == "sleep":
            self.sleep(action.level)
        else:
            self.wake_up(action.tags)

    def sleep(self, level: int = 1) -> None:
        """Free the engine's memory between rollouts: level 1 moves the weights to host and
        drops the KV cache; level 2 drops both (load_weights must follow the wake-up).
        On CPU vLLM cannot sleep: a no-op, logged once."""
        if level not in self.capabilities.sleep_levels:
            raise ValueError(f"sleep level {level}: vLLM has {self.capabilities.sleep_levels}")
        self._check_idle("sleep")
        if self.cpu:
            self._log_cpu_sleep()
            return
        if not self._sleeping:
            t0 = time.perf_counter()
            self.llm.sleep(level=level)
            self.residency_seconds["sleep"] += time.perf_counter() - t0
            log.info("vLLM engine asleep (level %d) in %.3f s", level, time.perf_counter() - t0)
            self._asleep, self._sleeping = level, {"weights", "kv_cache"}

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Wake the weights, the KV cache, or both (None). After level 2 the weights are
        garbage until load_weights; the prefix cache is reset with the KV it indexed."""
        if self.cpu:
            self._log_cpu_sleep()
            return
        wanted = set(tags or ("weights", "kv_cache")) & self._sleeping
        if not wanted:
            return
        t0 = time.perf_counter()
        self.llm.wake_up(tags=sorted(wanted))
        self.residency_seconds["wake"] += time.perf_counter() - t0
        log.info("vLLM engine woke %s in %.3f s", sorted(wanted), time.perf_counter() - t0)
        self._sleeping -= wanted
        if "kv_cache" in wanted:
            reset_caches(self.llm)  # the KV it indexed was dropped
        if not self._sleeping:
            self._asleep = None

    def _awake(self, what: str, *tags: str) -> None:
        asleep = self._sleeping.intersection(tags)
        if asleep:
            raise BackendError(
                f"cannot {what}: the vLLM engine's {' and '.join(sorted(asleep))} sleep "
                f"(level {self._asleep}); wake them first"
            )

    def _log_cpu_sleep(self) -> None:
        if not self._cpu_sleep_logged:
            log.info("vLLM on CPU cannot sleep: sleep/wake_up are no-ops (memory stays held)")
            self._cpu_sleep_logged = True
