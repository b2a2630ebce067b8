"""Which host and which device a trace says its rank ran on.

Kineto writes no host name into most traces (`host_name` is rare), but the files are named
after it: `torch.profiler.tensorboard_trace_handler` writes `<host>_<pid>.<ns>.pt.trace.json`,
`recprof capture` writes `rank<R>_<host>.pt.trace.json`. The device is the `pid` of the rank's
device events. Together they identify a device when no capture metadata does
(recprof/analysis/sharing.py). The header's own `host` stays what the trace's metadata says:
a name read from a file name identifies a device here, nothing more.
"""

from __future__ import annotations

import re
from pathlib import Path

from recprof.trace.model import TraceHeader

_NAMES = (
    re.compile(r"^rank\d+_(?P<host>.+?)\.pt\.trace\.json(\.gz)?$"),  # recprof capture
    re.compile(r"^(?P<host>.+)_\d+\.\d+\.pt\.trace\.json(\.gz)?$"),  # tensorboard_trace_handler
)


def trace_host(header: TraceHeader) -> str | None:
    """The rank's host: the trace's `host_name`, else the one its file name carries."""
    if header.host:
        return header.host
    name = Path(header.path).name
    for pattern in _NAMES:
        match = pattern.match(name)
        if match:
            return match.group("host")
    return None


def trace_device(header: TraceHeader) -> int | None:
    """The index of the one device the rank's activity ran on (None for several or none)."""
    return header.devices[0] if len(header.devices) == 1 else None
