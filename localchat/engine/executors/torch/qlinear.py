"""Linear layers over PyTorch's weight-only kernels (int4pack, int8pack), NF4 codes and dense
floats; GGUF's 4-bit blocks map exactly onto the int4 kernels' w = (q − 8)·scale + zero."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.errors import EngineError
from localchat.formats.nf4 import NF4Matrix, byte_table, dequantize_codes

GROUP = 32  # GGUF's 32-weight blocks


class Int4Linear(torch.nn.Module):
    """y = x @ Wᵀ with W in PyTorch's packed int4 layout, groups of 32 (exact for Q4_0/Q4_1)
    or of `group` weights (localchat's int4 files). On the CPU it runs in bfloat16 (float32
    inputs take a scalar path 20-50x slower); on CUDA/MPS it packs as gpt-fast does."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 device: torch.device = torch.device("cpu"), group: int = GROUP) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.group = group  # weights per (scale, zero): 32 for GGUF; 32..256 for int4 files
        if device.type == "cpu":
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                q.to(torch.int32).contiguous(), 2)
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


class Int4PairLinear(torch.nn.Module):
    """Q8_0 exactly on two int4 kernels: with u = code + 128 = 16·hi + lo, w = d·(u − 128)
    = [(lo − 8)·d + 8·d] + [(hi − 8)·16d]; the low and high nibbles run as two layers."""

    def __init__(self, codes: torch.Tensor, d: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.shape
        u, d = codes.to(torch.int32) + 128, d.float()
        self.low = Int4Linear(u & 15, d, 8 * d, device)
        self.high = Int4Linear(u >> 4, 16 * d, torch.zeros_like(d), device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.low(x) + self.high(x)


class RowStack(torch.nn.Module):
    """Layers stacked by output rows (one matmul's worth, each on its own kernel): their
    outputs side by side."""

    def __init__(self, parts: list[torch.nn.Module]) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


class DenseLinear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight.contiguous()
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class HalfLinear(torch.nn.Module):
    """A dense matrix held in float16 or bfloat16; activations are cast to it and back."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = weight.to(dtype).contiguous()
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)


class Int8Linear(torch.nn.Module):
    """y = x @ Wᵀ with W int8 per row: PyTorch's int8 weight-only kernel, activations in
    `act_dtype` (which one is faster differs by CPU: kernels.py measures it)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, act_dtype: torch.dtype,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.act_dtype = act_dtype
        self.codes = codes.to(device=device, dtype=torch.int8).contiguous()
        self.scales = scales.to(device=device, dtype=act_dtype).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).to(self.act_dtype),
                                               self.codes, self.scales)
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)


class NF4Linear(torch.nn.Module):
    """y = x @ Wᵀ with W kept as NF4 codes, dequantized CHUNK_ROWS rows at a time inside
    forward (never a persistent dense copy). float32 by default: it reproduces the
    dequantized weights exactly and is no slower at decode. Its tensors are plain attributes,
    read in forward, as in every layer here: aot_layer passes exactly those to a compiled
    layer as inputs (one held elsewhere would be compiled in as a constant)."""

    CHUNK_ROWS = 1024

    def __init__(self, matrix: NF4Matrix, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.out_features, self.in_features = matrix.shape
        self.blocksize = matrix.blocksize
        self.codes, self.absmax = matrix.codes, matrix.absmax
        self.table = byte_table(matrix.levels, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).to(self.table.dtype)
        outs = []
        for start in range(0, self.out_features, self.CHUNK_ROWS):
            rows = slice(start, start + self.CHUNK_ROWS)
            w = dequantize_codes(self.codes[rows], self.absmax[rows], self.table, self.blocksize)
            outs.append(F.linear(x2, w))
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)
