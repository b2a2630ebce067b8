"""What each kind of device is called and what its traces mean: the one home for device facts.

The analysis works on one trace model whatever ran the job (`DeviceKind` is one field of it);
what differs between a GPU, an Ascend NPU and a CPU-only (gloo) run is how the report must name
things and which facts hold for it. They are declared here, once per kind, and read everywhere:
no `if cuda` branches through the analysis or the report. A new kind of device is a new entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from recprof.trace.model import DeviceKind


@dataclass(frozen=True)
class DeviceFacts:
    """The words and facts of one kind of device."""

    #: What the report calls one device ("GPU", "NPU"); on CPU runs, the thread that computes.
    device: str
    #: The collective library its traces show ("NCCL", "HCCL", "gloo").
    collectives: str
    #: The unit that runs compute kernels, where it has a name users know ("SM", "AI Core").
    compute_unit: str | None
    #: Whether work is launched by the host and may sit queued on the device before it runs
    #: (accelerators), so an idle gap splits at the launch; a CPU run's "device" is the thread
    #: itself and nothing queues.
    queues_work: bool
    #: How the report names the kind of device a job ran on ("CUDA", "Ascend NPU").
    kind_name: str
    #: What one piece of its work is called, in the plural ("kernels", "NPU tasks").
    work: str
    #: The tool its users open for op-level questions on the profiler's own output, where that
    #: is not TensorBoard's PyTorch Profiler plugin on Kineto traces (`recprof view`): None there.
    viewer: str | None = None
    #: What lets several processes' kernels run on one device at once instead of in time
    #: slices, where the vendor has one: the advice for ranks that share one.
    concurrent_sharing: str | None = None
    #: The runtime calls in which the host blocks until its device has caught up (a stream or
    #: device synchronize, a synchronous copy): time the host is ahead of the device, in which
    #: host work a change adds can hide (whatif/device.py).
    host_waits: frozenset[str] = frozenset()


_FACTS: dict[DeviceKind, DeviceFacts] = {
    DeviceKind.CUDA: DeviceFacts("GPU", "NCCL", "SM", queues_work=True, kind_name="CUDA",
                                 work="kernels", concurrent_sharing="the CUDA MPS daemon",
                                 host_waits=frozenset({
                                     "cudaStreamSynchronize", "cudaDeviceSynchronize",
                                     "cudaEventSynchronize", "cudaMemcpy"})),
    DeviceKind.ROCM: DeviceFacts("GPU", "RCCL", "CU", queues_work=True, kind_name="ROCm",
                                 work="kernels",
                                 host_waits=frozenset({
                                     "hipStreamSynchronize", "hipDeviceSynchronize",
                                     "hipEventSynchronize", "hipMemcpy"})),
    DeviceKind.MTIA: DeviceFacts("MTIA accelerator", "collectives", None, queues_work=True,
                                 kind_name="MTIA", work="kernels"),
    DeviceKind.NPU: DeviceFacts("NPU", "HCCL", "AI Core", queues_work=True,
                                kind_name="Ascend NPU", work="NPU tasks",
                                viewer="MindStudio Insight",
                                host_waits=frozenset({
                                    "aclrtSynchronizeStream", "aclrtSynchronizeDevice",
                                    "aclrtSynchronizeEvent"})),
    DeviceKind.CPU: DeviceFacts("main thread", "gloo", None, queues_work=False, kind_name="CPU",
                                work="ops"),
}


def facts(kind: DeviceKind | str) -> DeviceFacts:
    """The facts of a device kind (given as the enum or its string value)."""
    return _FACTS[DeviceKind(kind)]


def of_document(kind: str) -> DeviceFacts:
    """The facts of the device kind an analysis document names: a document read back may name
    a kind this version does not know (a newer recprof's, or a damaged file), which is then
    described in neutral words under its own name."""
    try:
        return facts(kind)
    except ValueError:
        return DeviceFacts("device", "collectives", None, queues_work=True,
                           kind_name=kind[:40] or "unknown", work="device work")
