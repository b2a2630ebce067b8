"""Facts about the machine this process runs on: its cores, its CPU, its boot id.

One home for them: capture records them in each rank's metadata (`meta/rank<R>.json`), and the
analysis, the what-if, the mirror and the tuner read them of this machine when a run does not
say (traces from elsewhere are then assumed to come from a machine like this one).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine_id() -> str | None:
    """The running kernel's boot id: one per machine (or VM), shared by the containers and
    network namespaces on it, which report hostnames of their own. Ranks with different hosts
    and one machine id share that machine's cores. None where the OS has no boot id."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the OS has one): what the
    what-if replay asks of a CPU rank's host (is there a core to spare per rank?)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def cpu_model() -> str:
    """The CPU's marketing name (what `devices` holds on a CPU-only run)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
