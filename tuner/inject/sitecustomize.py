"""Imported at start-up by every Python process of a `recprof tune` trial: each rank writes its
peak memory when it exits.

`recprof tune` prepends this folder to the trial's PYTHONPATH and names a folder in the
environment (`tuner.inject.MEMORY_DIR_ENV`); a process that torchrun started as a rank (`RANK`
set) writes `rank<R>.json` there at exit: its peak resident set (the kernel's high-water mark,
VmHWM) and, when it used an accelerator, that device's allocator peak
(`torch.accelerator`, whatever the device: CUDA, an NPU, ...). Measured by the process
itself, so the number is the peak, not a sample, and the trainer needs no change. Processes
that fork from a rank (data-loader workers) inherit the exit hook but not the pid, and write
nothing.

A sitecustomize later on the path (a virtualenv's, the site's, the user's) is run first, as
`recprof capture`'s own does; only folders after this one are searched, so capture's, which
runs this one as the next, is not run again. Nothing here may stop the job: failures print a
warning.
"""

import atexit
import importlib.machinery
import importlib.util
import json
import os
import sys


def _run_shadowed_sitecustomize() -> None:
    """Execute the next `sitecustomize` on sys.path after this folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    rest = sys.path[paths.index(here) + 1:] if here in paths else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _peak_rss() -> int:
    """This process' peak resident set in bytes: VmHWM of /proc/self/status (Linux). Not
    getrusage's ru_maxrss, which keeps the largest image the process had before its exec: a
    rank that torchrun's Python started would report torchrun's size when that was larger."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise OSError("no VmHWM in /proc/self/status")


def _device_peak() -> tuple[str, int] | None:
    """(device type, allocator peak in bytes) when this process used an accelerator."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    device = torch.accelerator.current_accelerator()
    if device is None or not torch.get_device_module(device).is_initialized():
        return None
    return device.type, int(torch.accelerator.max_memory_allocated())


def _write_peak(folder: str, rank: str, pid: int) -> None:
    if os.getpid() != pid:  # a forked child (a data-loader worker), not the rank
        return
    try:
        record = {"rank": int(rank), "host_rss_bytes": _peak_rss()}
        device = _device_peak()
        if device is not None:
            record["device"], record["device_bytes"] = device
        path = os.path.join(folder, f"rank{rank}.json")
        os.makedirs(folder, exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            json.dump(record, fh)
        os.replace(path + ".tmp", path)
    except Exception as exc:
        print(f"[recprof tune] peak memory not recorded: {exc!r}", file=sys.stderr)


def _folder() -> str | None:
    """The folder named by the tuner, or None outside a trial (or where recprof is not
    importable, so the name cannot be read: then nothing is recorded)."""
    try:
        from tuner.inject import MEMORY_DIR_ENV
    except ImportError:
        return None
    return os.environ.get(MEMORY_DIR_ENV)


_run_shadowed_sitecustomize()
if os.environ.get("RANK", "").isdigit() and (_memory_dir := _folder()):
    atexit.register(_write_peak, _memory_dir, os.environ["RANK"], os.getpid())
