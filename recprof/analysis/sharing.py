"""Ranks that share one physical device.

Users put two ranks on one GPU by mistake (a LOCAL_RANK mapping that sends every rank to
device 0, CUDA_VISIBLE_DEVICES set to one device for all) and on purpose (MPS, small models).
Every timing of those ranks then includes the others' use of the device: time-sliced, a
launched kernel waits for the other process's slice (idle.DEVICE_HELD); under MPS the kernels
run together but split the device's SMs and memory bandwidth. The what-if and the tuner assume
one device per rank, so the job says which ranks share one (`JobAnalysis.shared_devices`).

A rank's device is identified, in this order of evidence:

- by capture's metadata (meta/rank<R>.json, written by recprof/capture/rank_meta.py): the
  device's UUID; else its PCI bus id on its machine; else its index among the host's devices
  (CUDA_VISIBLE_DEVICES resolved) on that host and machine (kernel boot id). Containers of one
  machine have their own device lists, so an index is only compared within a host;
- by the trace (recprof/trace/identity.py): host name + device index. A process that sees one
  device reads index 0 whichever GPU it was given (per-rank CUDA_VISIBLE_DEVICES, as SLURM
  sets it), so such a group is named only where the trace corroborates it: each of its ranks
  had launched work held on the device while nothing of its own ran for at least
  `CORROBORATION` of its step. With several visible devices the index is the device's own.

Ranks are compared only with ranks identified the same way.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from recprof.analysis.model import SharedDevice
from recprof.trace.identity import trace_device, trace_host
from recprof.trace.model import TraceHeader

#: Share of a step a rank's launched work must sit held on the device (idle.DEVICE_HELD) for a
#: trace-only group with one visible device to count as sharing it. Time-sliced ranks on one
#: H100 held 24-27% (gpu/timesliced_sync), under MPS 1.7% (gpu/mps_sync: not named from
#: the trace alone); one rank alone 0.1% (gpu/one_gpu).
CORROBORATION = 0.05
CAPTURE, TRACE = "capture", "trace"

_Identity = tuple[Hashable, str, str | None]  # (grouping key, device shown, host)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _physical(index: int, visible: str | None) -> int | str | None:
    """The device a process's index `index` denotes on its host: the index itself without
    CUDA_VISIBLE_DEVICES, else that list's entry (an index, or a GPU/MIG UUID); None where
    the list does not say."""
    if visible is None:
        return index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not 0 <= index < len(entries):
        return None
    entry = entries[index]
    if entry.isdigit():
        return int(entry)
    return entry if entry.startswith(("GPU-", "MIG-")) else None


def captured_identity(meta: dict[str, Any]) -> _Identity | None:
    """A rank's device as capture recorded it, or None where the metadata names none (a CPU
    run, a rank that died before its runtime facts were written)."""
    host = _text(meta.get("host"))
    machine = _text(meta.get("machine"))
    device = meta.get("device") if isinstance(meta.get("device"), dict) else {}
    uuid = _text(device.get("uuid"))
    if uuid:
        return ("uuid", uuid), uuid, host
    bus = _text(device.get("pci_bus_id"))
    if bus and (machine or host):
        return ("pci", machine or host, bus), f"{host or machine} PCI {bus}", host
    index = device.get("index", meta.get("current_device"))
    if not isinstance(index, int) or isinstance(index, bool) or host is None:
        return None
    env = meta.get("env") if isinstance(meta.get("env"), dict) else {}
    physical = _physical(index, _text(env.get("CUDA_VISIBLE_DEVICES")))
    if physical is None:
        return None
    if isinstance(physical, str):
        return ("uuid", physical), physical, host
    return ("index", host, machine, physical), f"{host} device {physical}", host


def trace_identity(header: TraceHeader, held_share: float) -> _Identity | None:
    """A rank's device as its trace shows it, where that is evidence enough (module doc)."""
    host, index = trace_host(header), trace_device(header)
    if host is None or index is None:
        return None
    several = header.visible_devices > 1
    if not several and held_share < CORROBORATION:
        return None
    return ("trace", host, index, several), f"{host} device {index}", host


def shared_devices(headers: dict[int, TraceHeader], metas: dict[int, dict[str, Any]],
                   held_share: dict[int, float]) -> list[SharedDevice]:
    """The groups of two or more ranks on one device, by rank, first rank first. `metas` are
    the ranks' capture metadata (those that have one), `held_share` each rank's share of its
    step with work held on the device by something outside it."""
    groups: dict[Hashable, tuple[str, str | None, str, list[int]]] = {}
    for rank in sorted(headers):
        identity = captured_identity(metas[rank]) if rank in metas else None
        source = CAPTURE
        if identity is None:
            identity, source = trace_identity(headers[rank], held_share.get(rank, 0.0)), TRACE
        if identity is None:
            continue
        key, shown, host = identity
        groups.setdefault((source, key), (shown, host, source, []))[3].append(rank)
    return [SharedDevice(device=shown, host=host, ranks=ranks, source=source)
            for shown, host, source, ranks in groups.values() if len(ranks) > 1]
