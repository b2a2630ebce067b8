"""meta/rank<R>.json: what one rank knows about itself, rewritten whenever it learns more.

Static facts (host, command, environment, schedule) are known at start-up; runtime facts
(versions, devices, the process group) only once the job has imported torch and started its
process group. Every rewrite goes through a temporary file and a rename, so the launcher (or a
kill at any moment) never sees half a file; a rank killed by SIGKILL keeps its last state.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from recprof.host import cpu_model, machine_id, usable_cores
from recprof.runfolder import layout
from recprof.runfolder.layout import ProfilerStatus, Schedule, StepSource

SCHEMA = "recprof.capture.rank/1"
_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED", "TORCHELASTIC_")
_ENV_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)


class RankMeta:
    """The metadata of one rank and the file it lives in. `steps_logged` is asked at each
    rewrite, so the file always says how far the rank got."""

    def __init__(
        self,
        path: Path,
        rank: int,
        host: str,
        schedule: Schedule,
        steps_logged: Callable[[], int],
        superseded: Callable[[], bool] = lambda: False,
    ) -> None:
        self.path = path
        self.steps_logged = steps_logged
        self.superseded = superseded  # a launcher's provisional rank 0 stops writing
        env = {
            k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES
        }
        cpu = cpu_model()
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "rank": rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "host": host,
            "pid": os.getpid(),
            "command": list(getattr(sys, "orig_argv", sys.argv)),
            "cwd": os.getcwd(),
            "python": platform.python_version(),
            "cpu": cpu,
            "cores": usable_cores(),
            "machine": machine_id(),
            "env": env,
            "schedule": {**asdict(schedule), "wait": schedule.wait_option},
            "window_steps": None,  # [first, last] recorded step, once the wait is decided
            "window_start": None,  # when and why recording starts (settle.Decision)
            "step_source": None,
            "profiler": {"status": ProfilerStatus.NOT_STARTED},
            "started_at": time.time(),
        }

    @property
    def profiler_status(self) -> ProfilerStatus:
        return ProfilerStatus(self.data["profiler"]["status"])

    def write(self) -> None:
        """Rewrite the file with what is known now (nothing, once superseded: the file is
        then the real rank 0's)."""
        if self.superseded():
            return
        self.data["steps_logged"] = self.steps_logged()
        layout.write_json_atomic(self.path, self.data)

    def set_window(self, window: Schedule, start: dict[str, Any]) -> None:
        """The window's steps, decided (`window` has its wait), and why it starts there."""
        self.data["window_steps"] = window.window_steps
        self.data["window_start"] = start
        self.write()

    def set_window_record(self, name: str, **fields: Any) -> None:
        """--on-demand: this rank's part in window `name` (`windows[name]`: status, steps,
        trace, bytes, why it was missed...); fields given as None are left out."""
        record = self.data.setdefault("windows", {}).setdefault(name, {})
        record.update({k: v for k, v in fields.items() if v is not None})
        self.write()

    def set_step_source(self, source: StepSource) -> None:
        self.data["step_source"] = source
        self.write()

    def set_profiler(self, **fields: Any) -> None:
        """Update the profiler record (fields given as None are left out) and rewrite."""
        self.data["profiler"].update({k: v for k, v in fields.items() if v is not None})
        self.write()

    def record_runtime(self, torch: Any) -> None:
        """What is only known once the job runs: versions, devices, the process group."""
        data = self.data
        data["torch"] = torch.__version__
        data["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            data["devices"] = [torch.cuda.get_device_name(i) for i in range(count)]
            data["current_device"] = torch.cuda.current_device()
            data["device"] = device_identity(torch, data["current_device"])
            try:
                data["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:
                data["nccl"] = None
        else:
            data["devices"] = [data["cpu"]]
            data["nccl"] = None
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            data["distributed"] = {
                "backend": str(dist.get_backend()),
                "world_size": dist.get_world_size(),
                "rank": dist.get_rank(),
            }
            data["world_size"] = dist.get_world_size()
        self.write()

    def record_exit(self, ended: dict[str, Any]) -> None:
        """The exit record, written last."""
        self.data["exit"] = ended
        self.data["ended_at"] = time.time()
        self.write()


def device_identity(torch: Any, index: int) -> dict[str, Any]:
    """The physical device a rank computes on, as torch knows it: its index in the process,
    its UUID and PCI address where this torch exposes them (recprof/analysis/sharing.py finds
    ranks that share one by them; the index alone is ambiguous behind CUDA_VISIBLE_DEVICES)."""
    out: dict[str, Any] = {"index": index}
    try:
        props = torch.cuda.get_device_properties(index)
    except Exception:  # a broken driver must not cost the rank its metadata
        return out
    out["name"] = str(getattr(props, "name", "")) or None
    uuid = getattr(props, "uuid", None)
    out["uuid"] = str(uuid) if uuid is not None and str(uuid) else None
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, int):
        domain = getattr(props, "pci_domain_id", 0)
        slot = getattr(props, "pci_device_id", 0)
        out["pci_bus_id"] = (f"{domain if isinstance(domain, int) else 0:08x}:{bus:02x}:"
                             f"{slot if isinstance(slot, int) else 0:02x}.0")
    return out
