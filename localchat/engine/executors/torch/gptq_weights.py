"""GPTQ matrices (formats/gptq.py) as torch engine layers: 4-bit matrices with sequential
g_idx run on the int4 kernel, the rest are dequantized to float32, and every packed layer
is checked against dequantize-then-matmul when built."""

from __future__ import annotations

import torch

from localchat.engine.executors.torch.qlinear import DenseLinear, Int4Linear
from localchat.errors import EngineError
from localchat.formats.gptq import GPTQMatrix, dequantize_gptq, sequential_group

KERNEL_GROUPS = (32, 64, 128, 256)


def gptq_linear(parts: list[GPTQMatrix],
                device: torch.device = torch.device("cpu")) -> torch.nn.Module:
    """One layer for matrices stacked by rows (fused q/k/v, gate/up)."""
    m = GPTQMatrix(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts], 1),
                   torch.cat([p.zeros for p in parts], 1), parts[0].g_idx, parts[0].bits,
                   parts[0].group_size)
    if any(p.bits != m.bits or p.shape[1] != m.shape[1] or not torch.equal(p.g_idx, m.g_idx)
           for p in parts):
        raise EngineError("GPTQ matrices to fuse differ in bits, width or groups")
    dense = dequantize_gptq(m)
    group = sequential_group(m)
    kernel = next((g for g in reversed(KERNEL_GROUPS)
                   if group and m.shape[1] % g == 0 and group % g == 0), None)
    if m.bits != 4 or kernel is None or device.type != "cpu":
        return DenseLinear(dense.to(device))
    starts = torch.arange(0, m.shape[1], kernel)
    scales = m.scales[starts // group].t()  # [out, in / kernel]
    zeros = (8 - m.zeros[starts // group].t()).float() * scales
    try:
        layer = Int4Linear(m.codes, scales.contiguous(), zeros.contiguous(), device, group=kernel)
        x = torch.randn(2, m.shape[1], generator=torch.Generator().manual_seed(0))
        expected = x @ dense.t()
        err = (layer(x) - expected).abs().max().item()
    except (RuntimeError, NotImplementedError):
        return DenseLinear(dense)  # a PyTorch build without the kernel
    if err > 2e-2 * max(1.0, expected.abs().max().item()):
        raise EngineError(f"GPTQ int4 kernel check failed (max error {err:.3g})")
    return layer
