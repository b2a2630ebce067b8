"""Spend trials well: fix knobs that the baseline's trace shows cannot help, and say why.

Each rule reads the baseline's per-step breakdown (the `StepNumbers` of its analysis) and names
the knobs whose only mechanism is already exhausted. A pruned knob stays at its baseline value
for the rest of the study; the decision and its reason are stored on the study so every worker
and every resumed run applies the same one, and the report lists it.
"""

from __future__ import annotations

from recprof.nestpipe.knobs import BYTES, OVERLAP, acting_on
from tuner.record import StepNumbers

# Below this share of the step, shaving the thing a knob attacks cannot move throughput by
# more than the run-to-run noise of a CPU/GPU trial.
HIDDEN_COMM_FRAC = 0.03
NOTHING_TO_OVERLAP_FRAC = 0.05

# What each rule prunes, from the knob registry: knobs that cut bytes by changing the numbers
# sent (they can only cost quality once communication is hidden), and knobs that hide
# communication or copies behind compute.
LOSSY_BYTE_KNOBS = acting_on(BYTES, lossy=True)
OVERLAP_KNOBS = acting_on(OVERLAP)


def prune_knobs(baseline: StepNumbers | None, searched: list[str]) -> dict[str, str]:
    """Knob -> reason it is not worth searching, given the baseline's analysis numbers."""
    if baseline is None:
        return {}
    pruned: dict[str, str] = {}
    exposed = baseline.exposed_comm_frac
    ratio = baseline.exposed_ratio
    if exposed < HIDDEN_COMM_FRAC:
        why = (
            f"communication is already hidden in the baseline: exposed communication is "
            f"{exposed:.1%} of the step (exposed ratio {ratio:.0%}), under {HIDDEN_COMM_FRAC:.0%}, "
            f"so sending fewer bytes cannot shorten the step and would only risk quality"
        )
        pruned.update({k: why for k in LOSSY_BYTE_KNOBS if k in searched})
    stall = exposed + baseline.exposed_copy_frac + baseline.idle_frac
    if stall < NOTHING_TO_OVERLAP_FRAC:
        why = (
            f"the baseline step is compute-bound: exposed communication, exposed copies and idle "
            f"together are {stall:.1%} of the step, under {NOTHING_TO_OVERLAP_FRAC:.0%}, so there "
            f"is nothing left to overlap"
        )
        pruned.update({k: why for k in OVERLAP_KNOBS if k in searched})
    return pruned
