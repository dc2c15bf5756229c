"""Linear layers that keep GGUF weights quantized in memory.

GGUF's 4-bit blocks map exactly onto PyTorch's int4 weight-only kernels: a Q4_1 block
of 32 weights is w = d·q + m with q in 0..15, and the int4pack kernels compute
w = (q − 8)·scale + zero per group, so scale = d and zero = m + 8·d (Q4_0: zero = 0,
since w = d·(q − 8)). Weights are packed at load, per device, never persisted, and
each packed layer is checked against a dequantize-then-matmul reference when built.
Other types are dequantized to a dense matrix (the fallback path).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from localchat.errors import EngineError

GROUP = 32  # Q4_0 / Q4_1 block size


def _split_q4_blocks(raw: np.ndarray, n_rows: int, n_cols: int, with_min: bool):
    """Raw Q4_0/Q4_1 bytes -> (q [N, K] int32 in 0..15, d [N, K/32], m [N, K/32] or None)."""
    block_bytes = 20 if with_min else 18
    blocks = raw.reshape(n_rows, n_cols // GROUP, block_bytes)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if with_min else None
    qs = blocks[..., block_bytes - 16:]
    low, high = qs & 0x0F, qs >> 4  # first 16 weights in the low nibbles, last 16 in the high
    q = np.concatenate([low, high], axis=-1).reshape(n_rows, n_cols).astype(np.int32)
    return q, d, m


class Int4Linear(torch.nn.Module):
    """y = x @ Wᵀ with W in PyTorch's packed int4 layout, groups of 32 (exact for Q4_0/Q4_1)
    or of `group` weights (localchat's int4 files).

    The CPU kernel runs in bfloat16 (activations, scales and zeros): with float32 inputs it
    takes a scalar path about 20-50x slower (measured here: 1.4 vs 31-105 GFLOP/s). On
    CUDA (and MPS where PyTorch has the kernel) the weights are packed from bytes of two
    4-bit values, first one in the high nibble, as gpt-fast does.
    """

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 device: torch.device = torch.device("cpu"), group: int = GROUP) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.group = group  # weights per (scale, zero): 32 for GGUF; 32..256 for int4 files
        if device.type == "cpu":
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 2)
            self._mm = torch.ops.aten._weight_int4pack_mm_for_cpu
        else:
            tiles = next((t for t in (8, 4, 2) if self.in_features % (16 * t) == 0), None)
            if tiles is None or self.out_features % 8:
                raise EngineError(f"no int4 tiling for a {self.out_features}x{self.in_features} matrix")
            q_bytes = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8).to(device)
            self.packed = torch.ops.aten._convert_weight_to_int4pack(q_bytes, tiles)
            self._mm = torch.ops.aten._weight_int4pack_mm
        # [K/group, N, 2]: (scale, zero) per group and output row
        self.scales_and_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(
            device=device, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self._mm(x.reshape(-1, self.in_features).to(torch.bfloat16), self.packed, self.group,
                     self.scales_and_zeros)
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)


class DenseLinear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight.contiguous()
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class HalfLinear(torch.nn.Module):
    """The output head (vocab × dim, the largest matrix of a small model) in 16 bits:
    bfloat16 where the CPU multiplies it natively (AVX512-BF16), else float16. Both give
    a row the same bits whatever other rows share the call (float32's gemm does not on
    AVX2: one row alone takes another kernel than two), and both are faster than float32
    there; measured figures are in the README. Logits keep ~3 significant digits, as
    llama.cpp's own 8-bit activations do."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = weight.to(dtype).contiguous()
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)


def head_linear(weight: torch.Tensor) -> torch.nn.Module:
    """The output projection of a head stored at 8 bits or fewer: 16 bits on the CPU."""
    if weight.device.type != "cpu":
        return DenseLinear(weight)
    native_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return HalfLinear(weight, torch.bfloat16 if native_bf16 else torch.float16)


def q4_parts(raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int):
    """A Q4_0/Q4_1 matrix as (q [N, K] int32, scale [N, K/32], zero [N, K/32]) for the
    int4 kernel's w = (q − 8)·scale + zero."""
    q, d, m = _split_q4_blocks(raw, n_rows, n_cols, with_min=ggml_type == Q.Q4_1)
    zeros = m + 8 * d if m is not None else np.zeros_like(d)
    return q, d, zeros


def int4_linear(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                device: torch.device = torch.device("cpu")) -> torch.nn.Module:
    """One Int4Linear for several matrices stacked by rows (fused q/k/v, gate/up). Off
    the CPU, where the int4 kernels vary by GPU and PyTorch build, a layer whose kernel
    is missing or fails the reference check is dequantized to float32 instead."""
    q, d, zeros = (np.concatenate(xs) for xs in zip(*parts))
    try:
        layer = Int4Linear(torch.from_numpy(q), torch.from_numpy(d), torch.from_numpy(zeros),
                           device)
        _check_against_reference(layer, q, d, zeros, device)
    except (RuntimeError, NotImplementedError, EngineError):
        if device.type == "cpu":
            raise
        return DenseLinear(_dequantized(q, d, zeros).to(device))
    return layer


def _dequantized(q, d, zeros) -> torch.Tensor:
    n_rows, n_cols = q.shape
    w = (q.reshape(n_rows, -1, GROUP) - 8) * d[..., None] + zeros[..., None]
    return torch.from_numpy(w.reshape(n_rows, n_cols).astype(np.float32))


def _check_against_reference(layer: Int4Linear, q, d, zeros, device: torch.device) -> None:
    """The packed kernel must reproduce dequantize-then-matmul; refuse to run otherwise."""
    w = _dequantized(q, d, zeros)
    x = torch.randn(2, q.shape[1], generator=torch.Generator().manual_seed(0))
    expected, got = x @ w.t(), layer(x.to(device)).cpu()
    err = (got - expected).abs().max().item()
    if err > 2e-2 * max(1.0, expected.abs().max().item()):  # bfloat16 activations
        raise EngineError(f"int4 kernel check failed (max error {err:.3g}); use --engine llama.cpp")
