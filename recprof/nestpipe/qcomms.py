"""Wire formats for the embedding all-to-alls (QComms): lossless, bf16, fp16 or row-scaled fp8.

`fp32` is the lossless format: rows travel in the run's own dtype (float32, or float64 with
`dtype=float64`; the name is the knob's contract with the tuner). The lossy formats stay lossy
in either dtype: rows are cast to the narrow type on the wire and decoded back to the run's
dtype. fp8 uses e4m3 for forward embeddings (precision) and e5m2 for backward gradients
(range), each row scaled by its absolute maximum. gloo's all-to-all rejects float8 dtypes, so
fp8 rows travel as uint8 with the row's float32 scale appended as four more bytes: one
all-to-all, not two.
"""

from __future__ import annotations

import torch

_FP8 = {"fwd": torch.float8_e4m3fn, "bwd": torch.float8_e5m2}
_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Codec:
    """Encodes (n, dim) rows of the run's dtype to a wire tensor and back."""

    def __init__(self, qcomms: str, direction: str, dtype: torch.dtype = torch.float32) -> None:
        self.qcomms = qcomms
        self.dtype = dtype
        self.fp8 = _FP8[direction] if qcomms == "fp8" else None

    def row_bytes(self, dim: int) -> int:
        """Bytes one row occupies on the wire."""
        if self.fp8 is not None:
            return dim + 4
        return dim * self._wire_dtype().itemsize

    def _wire_dtype(self) -> torch.dtype:
        """The element type of a bf16/fp16/full-precision wire tensor."""
        return self.dtype if self.qcomms == "fp32" else _HALF[self.qcomms]

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        if self.qcomms == "fp32":
            return rows.contiguous()
        if self.fp8 is None:
            return rows.to(_HALF[self.qcomms])
        fmax = torch.finfo(self.fp8).max
        # The scale travels as float32 (4 bytes) whatever the run's dtype; quantising with the
        # rounded scale keeps encode and decode consistent.
        scale = (rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / fmax).float()
        quant = (rows / scale).to(self.fp8).view(torch.uint8)
        return torch.cat([quant, scale.view(torch.uint8)], dim=1)

    def decode(self, wire: torch.Tensor, dim: int) -> torch.Tensor:
        if self.fp8 is None:
            return wire.to(self.dtype)
        quant = wire[:, :dim].contiguous().view(self.fp8).to(self.dtype)
        scale = wire[:, dim:].contiguous().view(torch.float32)
        return quant * scale

    def empty(self, n: int, dim: int, device: torch.device) -> torch.Tensor:
        """A receive buffer for n rows."""
        if self.fp8 is not None:
            return torch.empty(n, dim + 4, dtype=torch.uint8, device=device)
        return torch.empty(n, dim, dtype=self._wire_dtype(), device=device)
