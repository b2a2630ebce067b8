"""What each accelerator model can do at most: its dense peak FLOP rate per precision and its
memory bandwidth, the denominators of MFU and of a lookup's share of memory bandwidth.

One table, per model as a trace names it (`deviceProperties[].name`), with the matching rule
that turns a trace's name (or, where the name says nothing, its properties) into a row. The
numbers are the vendors' published datasheet values (NVIDIA: boost-clock peaks; AMD: "peak
theoretical"), **dense**: NVIDIA's tensor-core figures since Ampere are printed with 2:4
structured sparsity (marked "*") and are halved here. Sources (each row names its own):

- [nv-v100] NVIDIA V100 datasheet (volta-v100-datasheet-update-us-1165301-r5.pdf)
- [nv-a100] NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)
- [nv-h100] https://www.nvidia.com/en-us/data-center/h100/ (SXM, PCIe, NVL columns)
- [nv-h200] https://www.nvidia.com/en-us/data-center/h200/ (SXM, NVL columns)
- [nv-hgx] https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200 8-GPU totals, / 8)
- [nv-gb200] https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (per GPU)
- [amd-mi210], [amd-mi250], [amd-mi250x] https://www.amd.com/en/products/accelerators/
  instinct/mi200/{mi210,mi250,mi250x}.html (MI250/MI250X: per package of two GCDs, halved:
  each GCD is a device of its own in a trace)
- [amd-mi300x], [amd-mi325x], [amd-mi350x] https://www.amd.com/en/products/accelerators/
  instinct/mi300/{mi300x,mi325x}.html, .../mi350/mi350x.html

Which peak an op is held to (`DevicePeaks.peak`): its input dtype's. fp32 matrix products
run at the fp32 rate (PyTorch leaves `torch.backends.cuda.matmul.allow_tf32` off since 1.12);
fp32 convolutions on an NVIDIA GPU with TF32 run at the TF32 rate (`cudnn.allow_tf32` is on by
default). On AMD the fp32 figure is the matrix cores' (MFMA), which rocBLAS' fp32 GEMM uses.
docs/analysis.md (GPU use) has the table as read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DevicePeaks:
    """One accelerator model's dense peaks (TFLOP/s per precision; None where it has no such
    unit or the vendor publishes none) and its memory bandwidth (GB/s)."""

    model: str
    fp64: float | None
    fp32: float | None
    tf32: float | None
    fp16: float | None
    bf16: float | None
    fp8: float | None
    memory_gbps: float | None
    source: str
    #: fp32 convolutions run on TF32 tensor cores by default (NVIDIA, Ampere and later).
    tf32_convolutions: bool = False

    def peak(self, precision: str, convolution: bool = False) -> float | None:
        """The dense peak in FLOP/s an op of `precision` (fp64, fp32, fp16, bf16, fp8) can
        reach on this model, or None where the table has none."""
        if precision == "fp32" and convolution and self.tf32_convolutions and self.tf32:
            return self.tf32 * 1e12
        tflops = {"fp64": self.fp64, "fp32": self.fp32, "tf32": self.tf32, "fp16": self.fp16,
                  "bf16": self.bf16, "fp8": self.fp8}.get(precision)
        return tflops * 1e12 if tflops is not None else None


def _nv(model: str, fp64: float, fp32: float, tf32: float | None, half: float,
        fp8: float | None, memory: float, source: str, bf16: bool = True) -> DevicePeaks:
    return DevicePeaks(model, fp64, fp32, tf32, half, half if bf16 else None, fp8, memory, source,
                       tf32_convolutions=tf32 is not None)


def _amd(model: str, fp64: float, fp32: float, tf32: float | None, half: float,
         fp8: float | None, memory: float, source: str) -> DevicePeaks:
    return DevicePeaks(model, fp64, fp32, tf32, half, half, fp8, memory, source)


#: Every model the matching rule can name. FP64 is the tensor/matrix rate where there is one
#: (what a DGEMM reaches); V100 has no BF16 and no TF32.
PEAKS: dict[str, DevicePeaks] = {p.model: p for p in (
    _nv("V100 SXM2", 7.8, 15.7, None, 125.0, None, 900.0, "nv-v100", bf16=False),
    _nv("V100 PCIe", 7.0, 14.0, None, 112.0, None, 900.0, "nv-v100", bf16=False),
    _nv("V100S PCIe", 8.2, 16.4, None, 130.0, None, 1134.0, "nv-v100", bf16=False),
    _nv("A100 SXM4 40GB", 19.5, 19.5, 156.0, 312.0, None, 1555.0, "nv-a100"),
    _nv("A100 SXM4 80GB", 19.5, 19.5, 156.0, 312.0, None, 2039.0, "nv-a100"),
    _nv("A100 PCIe 40GB", 19.5, 19.5, 156.0, 312.0, None, 1555.0, "nv-a100"),
    _nv("A100 PCIe 80GB", 19.5, 19.5, 156.0, 312.0, None, 1935.0, "nv-a100"),
    _nv("H100 SXM5", 67.0, 67.0, 494.7, 989.4, 1978.9, 3350.0, "nv-h100"),
    _nv("H100 PCIe", 51.0, 51.0, 378.0, 756.0, 1513.0, 2000.0, "nv-h100"),
    _nv("H100 NVL", 60.0, 60.0, 417.5, 835.5, 1670.5, 3900.0, "nv-h100"),
    _nv("H200 SXM", 67.0, 67.0, 494.7, 989.4, 1978.9, 4800.0, "nv-h200"),
    _nv("H200 NVL", 60.0, 60.0, 417.5, 835.5, 1670.5, 4800.0, "nv-h200"),
    _nv("B200", 37.0, 75.0, 1125.0, 2250.0, 4500.0, 8000.0, "nv-hgx"),
    # NVIDIA publishes no FP32 (non-tensor) figure per GB200 GPU beside the tensor ones.
    DevicePeaks("GB200", 45.0, None, 1250.0, 2500.0, 2500.0, 5000.0, 8000.0, "nv-gb200",
                tf32_convolutions=True),
    _amd("MI210", 45.3, 45.3, None, 181.0, None, 1600.0, "amd-mi210"),
    _amd("MI250 GCD", 45.3, 45.3, None, 181.0, None, 1600.0, "amd-mi250"),
    _amd("MI250X GCD", 47.9, 47.9, None, 191.5, None, 1600.0, "amd-mi250x"),
    _amd("MI300X", 163.4, 163.4, 653.7, 1307.4, 2614.9, 5300.0, "amd-mi300x"),
    _amd("MI325X", 163.4, 163.4, 653.7, 1307.4, 2614.9, 6000.0, "amd-mi325x"),
    _amd("MI350X", 72.1, 144.2, None, 2306.9, 4613.7, 8000.0, "amd-mi350x"),
    # Huawei publishes no per-chip datasheet for the 910B (the original Ascend 910 was presented
    # at 256 TFLOPS FP16, Hot Chips 2019; third-party figures for the 910B range from 256 to
    # ~376 TFLOPS and 0.8 to 1.6 TB/s): the model is known, its peaks are not.
    DevicePeaks("Ascend 910B", None, None, None, None, None, None, None, "none published"),
)}

#: The name rule, first match wins, on the name lower-cased with spaces collapsed and the
#: vendor words (nvidia, tesla, amd instinct, " vf" of a virtual function) taken off.
_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"gb200", "GB200"),
    (r"b200", "B200"),
    (r"h200.*nvl", "H200 NVL"),
    (r"h200", "H200 SXM"),
    (r"h100.*nvl", "H100 NVL"),
    (r"h100.*pcie", "H100 PCIe"),
    (r"h[18]00", "H100 SXM5"),  # "H100 80GB HBM3" is the SXM5 part; H800: same FLOPS
    (r"a[18]00.*pcie", "A100 PCIe"),
    (r"a[18]00", "A100 SXM4"),  # PG509-200 is Meta's A100 40 GB SXM board
    (r"v100s", "V100S PCIe"),
    (r"v100.*pcie", "V100 PCIe"),
    (r"v100", "V100 SXM2"),  # SXM2-16GB/32GB, DGXS-32GB
    (r"mi350x", "MI350X"),
    (r"mi325x", "MI325X"),
    (r"mi300x", "MI300X"),
    (r"mi250x", "MI250X GCD"),
    (r"mi250", "MI250 GCD"),
    (r"mi210", "MI210"),
    (r"ascend ?910b", "Ascend 910B"),
)
_VENDOR_WORDS = re.compile(r"\b(nvidia|tesla|amd instinct)\b|\bvf$")
#: (computeMajor, computeMinor, numSms) -> model, for names that say nothing ('' in ROCm graph
#: traces, a generic "AMD Radeon Graphics"): AMD parts as real traces show them. NVIDIA traces
#: always name the part, and its properties would not tell an H100 SXM from an NVL (132 SMs
#: both), nor MI350X from MI355X (gfx950, 256 CUs both, other clocks): left unknown.
_BY_PROPERTIES: dict[tuple[int, int, int], str] = {
    (9, 4, 304): "MI300X",
    (9, 0, 104): "MI250 GCD",  # MI210 has the same per-device peaks
    (9, 0, 110): "MI250X GCD",
}
_GIB = 1 << 30


def model_of(name: str, properties: dict[str, Any] | None = None) -> str | None:
    """The table's model for a device a trace names (`deviceProperties` entry: name and, for
    the fallback and the memory size, its properties), or None when the rule knows none."""
    text = _VENDOR_WORDS.sub("", " ".join(name.lower().split())).strip()
    props = properties or {}
    for pattern, model in _NAME_RULES:
        if re.search(pattern, text):
            if model in ("A100 SXM4", "A100 PCIe"):
                return f"{model} {'80GB' if _memory_gib(props, text) > 60 else '40GB'}"
            return model
    key = tuple(props.get(k) for k in ("computeMajor", "computeMinor", "numSms"))
    model = _BY_PROPERTIES.get(key) if all(isinstance(v, int) for v in key) else None
    if model == "MI300X" and _memory_gib(props, text) > 200:
        return "MI325X"  # 256 GB of HBM3E on the same die
    return model


def _memory_gib(props: dict[str, Any], text: str) -> float:
    """The device's memory in GiB, from its properties, else the name's "80GB"."""
    mem = props.get("totalGlobalMem")
    if isinstance(mem, (int, float)) and not isinstance(mem, bool) and mem > 0:
        return float(mem) / _GIB
    found = re.search(r"(\d+)\s*gb", text)
    return float(found.group(1)) if found else 0.0


def peaks_of(model: str | None) -> DevicePeaks | None:
    """The row of a model `model_of` named (None: unknown)."""
    return PEAKS.get(model) if model else None
