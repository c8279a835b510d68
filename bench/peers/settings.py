"""The settings every framework of the peers bench runs with, in one place.

Each runner maps these onto its own config names (TRL's GRPOConfig, verl's Hydra keys,
rollplex's overrides), so a comparison never differs in a hyperparameter by accident.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(slots=True, frozen=True)
class PeerSettings:
    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int = 128  # every response runs to it: EOS ignored in all frameworks
    lr: float = 1e-6
    kl_coef: float = 0.04  # k3 KL loss to the reference (verl use_kl_loss, TRL beta)
    temperature: float = 1.0
    steps: int = 6
    seed: int = 0

    @staticmethod
    def add_inputs(ap: argparse.ArgumentParser) -> None:
        """The inputs every peer runs on: the model folder, the prompts, their names."""
        ap.add_argument("--model", type=Path, required=True)
        ap.add_argument("--data", type=Path, required=True)
        ap.add_argument("--shape", required=True)
        ap.add_argument("--workload", required=True)

    @classmethod
    def add_arguments(cls, ap: argparse.ArgumentParser) -> None:
        for f in fields(cls):
            ap.add_argument(
                "--" + f.name.replace("_", "-"), type=type(f.default), default=f.default
            )

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> PeerSettings:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rollplex_overrides(self) -> list[str]:
        """The same settings as `rollplex train` overrides (EOS ignored: fixed lengths)."""
        n = self.max_new_tokens
        return [
            f"workload.prompts_per_step={self.prompts_per_step}",
            f"workload.group_size={self.group_size}",
            "workload.response_length.distribution=fixed",
            f"workload.response_length.mean={n}",
            f"workload.response_length.max={n}",
            f"train.max_new_tokens={n}",
            "train.response_lengths=workload",
            f"algo.lr={self.lr}",
            f"algo.kl_coef={self.kl_coef}",
            "algo.loss_agg_mode=token-mean",
            f"algo.temperature={self.temperature}",
            f"train.steps={self.steps}",
            f"seed={self.seed}",
        ]
