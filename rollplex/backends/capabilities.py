"""What a role can do, declared on its class so the planner plans only that.

A vLLM rollout, for example, decodes in segments (engine steps) but cannot export its
prefix KV to another role, nor host rows of another phase inside its decode steps: the
planner must not place a piggyback there, and its prefix caching stands in for a separate
`prefix_prefill`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class RoleCapabilities:
    segmented_decode: bool = False  # decode can stop after a segment and resume
    prefix_kv_export: bool = False  # its prefix KV can be handed to another role
    piggyback_rows: bool = False  # other phases' rows can ride on its decode steps
    sleep_levels: tuple[int, ...] = ()  # levels of sleep() that free memory (vLLM: 1, 2)
    in_place_weight_load: bool = False  # load_weights updates the running engine, no restart
    # which weights versions its ops read: "live" (the trainer's current parameters,
    # aliased or copied in) and/or "checkpoint" (a model folder)
    weights_sources: tuple[str, ...] = ("live", "checkpoint")
    # the engine does prefix caching and vision encoding itself: prefix_prefill and
    # vision_encode are bookkeeping, their real work happens inside decode
    fused_prefix: bool = False
