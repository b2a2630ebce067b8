"""Every device kind the trace model knows has its facts declared (recprof/trace/devices.py)."""

import pytest

from recprof.trace import devices
from recprof.trace.model import DeviceKind


@pytest.mark.parametrize("kind", list(DeviceKind))
def test_every_device_kind_has_facts(kind: DeviceKind) -> None:
    facts = devices.facts(kind)
    assert facts.device and facts.collectives and facts.kind_name and facts.work
    assert devices.facts(kind.value) is facts


def test_only_accelerators_queue_work() -> None:
    assert not devices.facts(DeviceKind.CPU).queues_work
    assert devices.facts(DeviceKind.CUDA).queues_work


def test_ascend_npus_speak_ascend() -> None:
    npu = devices.facts(DeviceKind.NPU)
    assert (npu.device, npu.collectives, npu.compute_unit) == ("NPU", "HCCL", "AI Core")
    assert npu.viewer == "MindStudio Insight"  # TensorBoard's plugin reads no torch_npu output
