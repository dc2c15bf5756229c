"""localchat's INT8/INT4 matrices (formats/intq.py) as layers: INT8 on PyTorch's int8
weight-only kernel, INT4 on int4pack; kernels.py measures and checks."""

from __future__ import annotations

import torch

from localchat.engine.executors.torch.kernels import KernelChooser, SourceMatrix
from localchat.errors import EngineError
from localchat.formats.intq import IntMatrix, column_scales, dequantize_int

INT4_KERNEL_GROUPS = (32, 64, 128, 256)


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
