"""The runtime: applies a Plan to a backend (streams and events, memory effects, offloads),
measures what ran, and checkpoints training state.

    executor = Executor(plan, graph, backend, callbacks=[Progress(steps)])
    result = executor.run_step(k, inputs)        # one RL step: StepResult
    timeline = measured_timeline(plan, results)  # for rollplex.trace.write_profiler_traces
"""

from rollplex.runtime.callbacks import Callback, Callbacks, Progress
from rollplex.runtime.executor import ExecutionError, Executor
from rollplex.runtime.memory import Env, iter_tensors
from rollplex.runtime.order import Deviation, OrderError, issue_order, plan_order
from rollplex.runtime.record import (
    MeasuredStep,
    StepResult,
    calibration_entries,
    measured_timeline,
    write_measured_calibration,
)

__all__ = [
    "Callback",
    "Callbacks",
    "Deviation",
    "Env",
    "ExecutionError",
    "Executor",
    "MeasuredStep",
    "OrderError",
    "Progress",
    "StepResult",
    "calibration_entries",
    "issue_order",
    "iter_tensors",
    "measured_timeline",
    "plan_order",
    "write_measured_calibration",
]
