"""The three step schedules. Each maps a PlanningContext to a Plan (steps not yet timed)."""

from rollplex.planner.schedules.common import PlanningContext
from rollplex.planner.schedules.disaggregated import plan_disaggregated
from rollplex.planner.schedules.rollplex import plan_rollplex
from rollplex.planner.schedules.serial import plan_serial

SCHEDULES = {"serial": plan_serial, "disaggregated": plan_disaggregated, "rollplex": plan_rollplex}

__all__ = ["SCHEDULES", "PlanningContext", "plan_disaggregated", "plan_rollplex", "plan_serial"]
