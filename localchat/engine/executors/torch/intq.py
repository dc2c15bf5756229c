"""localchat's INT8 (per row) and INT4 (per group) safetensors weights, as quantize/int_hf.py
writes them, and their layers: w = code · scale (symmetric absmax), INT8 on PyTorch's int8
weight-only kernel, INT4 on int4pack; kernels.py measures and checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from localchat.engine.executors.torch.kernels import KernelChooser, SourceMatrix
from localchat.errors import EngineError

QUANT_METHOD = "localchat-int"
SCALE_SUFFIX = "_scale"
INT4_KERNEL_GROUPS = (32, 64, 128, 256)


@dataclass
class IntMatrix:
    codes: torch.Tensor  # int8 [out, in], unpacked
    scales: torch.Tensor  # float32 [out, ceil(in / group)]
    bits: int
    group: int  # weights per scale along a row (in: one per row)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes −8..7 [out, in] -> uint8 [out, in/2] (code + 8; even column low)."""
    u = (codes.to(torch.int16) + 8).to(torch.uint8)
    return u[:, 0::2] | (u[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    low, high = packed & 15, packed >> 4
    return (torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1).to(torch.int8) - 8)


def load_int(get: Callable[[str], torch.Tensor | None], name: str, bits: int,
             group_size: int | None) -> IntMatrix:
    """The matrix stored under `name` (and name + "_scale"), checked."""
    stored, scales = get(name), get(name + SCALE_SUFFIX)
    if stored is None or scales is None:
        raise EngineError(f"{name}: INT{bits} weight lacks its codes or scales")
    if bits == 8 and stored.dtype == torch.int8:
        codes = stored
    elif bits == 4 and stored.dtype == torch.uint8:
        codes = unpack_int4(stored)
    else:
        raise EngineError(f"{name}: INT{bits} codes stored as {stored.dtype}")
    group = group_size or (codes.shape[1] if codes.dim() == 2 else 0)
    if (codes.dim() != 2 or scales.dim() != 2 or group <= 0
            or tuple(scales.shape) != (codes.shape[0], -(-codes.shape[1] // group))):
        raise EngineError(f"{name}: scales {list(scales.shape)} do not fit codes "
                          f"{list(codes.shape)} in groups of {group}")
    return IntMatrix(codes, scales.float(), bits, group)


def column_scales(m: IntMatrix, group: int) -> torch.Tensor:
    """Scales as [out, ceil(in / group)] for a smaller `group` that divides m.group."""
    starts = torch.arange(0, m.shape[1], group)
    return m.scales[:, starts // m.group]


def dequantize_int(m: IntMatrix) -> torch.Tensor:
    return m.codes.float() * column_scales(m, 1)


def kernel_group(m: IntMatrix) -> int | None:
    """The largest group the int4 kernel takes that divides both the row and m.group."""
    return next((g for g in reversed(INT4_KERNEL_GROUPS)
                 if m.shape[1] % g == 0 and m.group % g == 0), None)


def int_linear(parts: list[IntMatrix], chooser: KernelChooser, label: str) -> torch.nn.Module:
    """One layer for matrices stacked by rows (fused q/k/v, gate/up), on the kernel the
    chooser measures fastest among those that run the codes as stored."""
    first = parts[0]
    if any(p.bits != first.bits or p.group != first.group or p.shape[1] != first.shape[1]
           for p in parts):
        raise EngineError("INT matrices to fuse differ in bits, group size or width")
    m = IntMatrix(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                  first.bits, first.group)
    per_row = m.scales.shape[1] == 1
    int8 = (m.codes, m.scales[:, 0]) if m.bits == 8 and per_row else None
    int4 = None
    if m.bits == 4 and (g := kernel_group(m)):
        scales = column_scales(m, g)
        int4 = (m.codes.to(torch.int32) + 8, scales, torch.zeros_like(scales), g)
    kind = f"int{m.bits}" + ("" if per_row else f"-g{m.group}")
    n_bytes = m.codes.numel() * m.bits // 8 + m.scales.numel() * 4
    source = SourceMatrix(dequantize_int(m), kind, n_bytes, 8 * n_bytes / m.codes.numel(),
                          int4=int4, int8=int8)
    return chooser.build(source, label)
