"""Hooks into the executor: around every plan step, and after every RL step.

Callbacks observe; they never change what runs. Progress bars and metric writers are
callbacks, so the executor has no opinion about either.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollplex.engine.phases import watch
from rollplex.planner.plan import Step
from rollplex.runtime.record import MeasuredStep, StepResult


class Callback:
    """Override what you need; every hook defaults to doing nothing."""

    def on_step_start(self, rl_step: int, step: Step) -> None:
        """Before a plan step (one op or chunk) is issued."""

    def on_step_end(self, rl_step: int, measured: MeasuredStep) -> None:
        """After a plan step ran (CPU) or was issued (CUDA: times are filled in later)."""

    def on_rl_step_end(self, result: StepResult) -> None:
        """After a whole RL step, with its metrics and measurements."""


class Callbacks(Callback):
    def __init__(self, callbacks: Sequence[Callback] = ()) -> None:
        self.items = list(callbacks)

    def on_step_start(self, rl_step: int, step: Step) -> None:
        for c in self.items:
            c.on_step_start(rl_step, step)

    def on_step_end(self, rl_step: int, measured: MeasuredStep) -> None:
        for c in self.items:
            c.on_step_end(rl_step, measured)

    def on_rl_step_end(self, result: StepResult) -> None:
        for c in self.items:
            c.on_rl_step_end(result)


class Progress(Callback):
    """A tqdm bar over RL steps with the latest metrics in its postfix, and the one-time
    phase running (engine/phases.py: model load, a compilation, a graph capture) in its
    description."""

    def __init__(
        self,
        total: int,
        initial: int = 0,
        keys: Sequence[str] = ("reward", "kl", "reward_kl"),  # each where the step has it
        disable: bool | None = None,
    ) -> None:
        from tqdm.auto import tqdm

        self.keys = tuple(keys)
        self.bar = tqdm(
            total=total,
            initial=initial,
            desc="train",
            unit="step",
            disable=disable,
            dynamic_ncols=True,
        )
        self._unwatch = watch(self._show_phase)

    def _show_phase(self, name: str | None) -> None:
        self.bar.set_description("train" if name is None else f"train ({name})")

    def on_rl_step_end(self, result: StepResult) -> None:
        shown = {k: f"{result.metrics[k]:.3f}" for k in self.keys if k in result.metrics}
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self._unwatch()
        self.bar.close()
