"""Quantization-aware training: a weight as llama.cpp will see it once written as Q8_0, Q4_1 or
Q4_0 (gguf's own rounding, scales in float16), with the straight-through gradient, so a trained
draft can be written at 4 bits without losing what it learned."""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as Q

BLOCK = 32  # values per block along a row, for all three types
SUPPORTED = (Q.Q8_0, Q.Q4_1, Q.Q4_0)


def quant_dequant(w: torch.Tensor, matrix_type: Q) -> torch.Tensor:
    """w [rows, cols] rounded as gguf.quants.quantize(w, matrix_type) and dequantized back
    (float32, bit for bit); cols must be a multiple of 32."""
    rows, cols = w.shape
    x = w.detach().float().reshape(rows, cols // BLOCK, BLOCK)
    if matrix_type == Q.Q4_1:
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        d = (hi - lo) / 15
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.trunc((x - lo) * inv + 0.5).clamp(0, 15)
        out = q * _half(d) + _half(lo)
    elif matrix_type == Q.Q4_0:
        at = x.abs().argmax(-1, keepdim=True)
        d = torch.gather(x, -1, at) / -8
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.trunc(x * inv + 8.5).clamp(0, 15)
        out = (q - 8) * _half(d)
    elif matrix_type == Q.Q8_0:
        d = x.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.sign(x * inv) * torch.floor((x * inv).abs() + 0.5)  # roundf: half away from 0
        out = q * _half(d)
    else:
        raise ValueError(f"no fake quantization for {matrix_type.name}")
    return out.reshape(rows, cols)


def fake_quant(w: torch.Tensor, matrix_type: Q) -> torch.Tensor:
    """quant_dequant(w) in the forward pass; the gradient passes to w unchanged (straight-through)."""
    return quant_dequant(w, matrix_type) + (w - w.detach())  # exactly the rounded values


def _half(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float16).float()
