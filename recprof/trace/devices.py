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
    #: The runtime calls that take or give back device (and pinned host) memory, the ones a
    #: caching allocator makes when it frees its cache and allocates again first: that time
    #: shows up here, not as launches.
    allocator_calls: tuple[str, ...] = ()
    #: How a job turns the caching allocator's behaviour, where the vendor's runtime has such a
    #: setting (the knob the allocator finding names).
    allocator_knob: str | None = None
    #: Whether the host's op is where it issues the device's work: torch_npu's ops hand their
    #: tasks to a queue that submits them later, on another thread, so an op's own time is its
    #: launch (a CUDA op's launch is the runtime call inside it).
    ops_issue_work: bool = False


_FACTS: dict[DeviceKind, DeviceFacts] = {
    DeviceKind.CUDA: DeviceFacts("GPU", "NCCL", "SM", queues_work=True, kind_name="CUDA",
                                 work="kernels", concurrent_sharing="the CUDA MPS daemon",
                                 host_waits=frozenset({
                                     "cudaStreamSynchronize", "cudaDeviceSynchronize",
                                     "cudaEventSynchronize", "cudaMemcpy"}),
                                 allocator_calls=(
                                     "cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost",
                                     "cudaHostAlloc", "cudaHostRegister", "cudaHostUnregister",
                                     "cudaMallocAsync", "cudaFreeAsync", "cuMemAlloc_v2",
                                     "cuMemFree_v2", "cuMemCreate", "cuMemRelease", "cuMemMap",
                                     "cuMemUnmap", "cuMemSetAccess", "cuMemAddressReserve",
                                     "cuMemAddressFree"),
                                 allocator_knob="PYTORCH_CUDA_ALLOC_CONF"),
    DeviceKind.ROCM: DeviceFacts("GPU", "RCCL", "CU", queues_work=True, kind_name="ROCm",
                                 work="kernels",
                                 host_waits=frozenset({
                                     "hipStreamSynchronize", "hipDeviceSynchronize",
                                     "hipEventSynchronize", "hipMemcpy"}),
                                 allocator_calls=(
                                     "hipMalloc", "hipFree", "hipHostMalloc", "hipHostFree",
                                     "hipMallocAsync", "hipFreeAsync", "hipHostRegister",
                                     "hipHostUnregister"),
                                 allocator_knob="PYTORCH_HIP_ALLOC_CONF"),
    DeviceKind.MTIA: DeviceFacts("MTIA accelerator", "collectives", None, queues_work=True,
                                 kind_name="MTIA", work="kernels"),
    DeviceKind.NPU: DeviceFacts("NPU", "HCCL", "AI Core", queues_work=True,
                                kind_name="Ascend NPU", work="NPU tasks",
                                viewer="MindStudio Insight",
                                host_waits=frozenset({
                                    "aclrtSynchronizeStream", "aclrtSynchronizeDevice",
                                    "aclrtSynchronizeEvent"}),
                                allocator_calls=(
                                    "aclrtMalloc", "aclrtFree", "aclrtMallocHost",
                                    "aclrtFreeHost"),
                                allocator_knob="PYTORCH_NPU_ALLOC_CONF",
                                ops_issue_work=True),
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
