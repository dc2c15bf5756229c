"""Round-to-nearest weight schemes as (quantize, dequantize) on one float32 matrix: symmetric
absmax per tensor, row or group; simulate() adds NF4 and the GGUF block types."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from localchat.errors import UsageError

INT_SCHEMES: dict[str, tuple[int, str | int]] = {
    "int8-tensor": (8, "tensor"), "int8-row": (8, "row"),
    "int4-tensor": (4, "tensor"), "int4-row": (4, "row"),
    "int4-g32": (4, 32), "int4-g64": (4, 64), "int4-g128": (4, 128),
}
GGUF_SIM_TYPES = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")
TABLE_SCHEMES = ("int8-tensor", "int8-row", "int4-tensor", "int4-row", "int4-g128", "nf4",
                 "Q8_0", "Q5_0", "Q4_1", "Q4_0")
SCALE_BITS = 32  # scales are stored as float32


def _blocks(w: torch.Tensor, granularity: str | int) -> torch.Tensor:
    """w as [scale rows, scales per row, weights per scale]; a row that is not whole
    groups ends in a shorter group (zero-padded here, as GPTQ's g_idx = col // g)."""
    rows, cols = w.shape
    if granularity == "tensor":
        return w.reshape(1, 1, -1)
    if granularity == "row":
        return w.reshape(rows, 1, cols)
    padded = torch.nn.functional.pad(w, (0, -cols % granularity))
    return padded.reshape(rows, -1, granularity)


def rtn_quantize(w: torch.Tensor, bits: int, granularity: str | int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes shaped like w, float32 scales [n_scale_rows, n_scale_cols])."""
    bound = 2 ** (bits - 1) - 1
    blocks = _blocks(w.float(), granularity)
    absmax = blocks.abs().amax(dim=-1)
    scales = torch.where(absmax > 0, absmax / bound, torch.ones_like(absmax))
    codes = torch.round(blocks / scales[..., None]).clamp(-bound, bound).to(torch.int8)
    if granularity == "tensor":
        return codes.reshape(w.shape), scales
    return codes.reshape(codes.shape[0], -1)[:, :w.shape[1]].contiguous(), scales


def rtn_dequantize(codes: torch.Tensor, scales: torch.Tensor, group: int | None = None) -> torch.Tensor:
    """codes · scale: one scale ([1, 1]), one per row ([rows, 1]) or one per row and
    `group` columns ([rows, ceil(cols / group)])."""
    cols = codes.shape[1]
    if group is None:
        return codes.float() * (scales.reshape(()) if scales.numel() == 1 else scales)
    return codes.float() * scales[:, torch.arange(cols) // group]


def _gguf_round_trip(w: torch.Tensor, type_name: str) -> tuple[torch.Tensor, float]:
    qtype = Q[type_name]
    block, size = GGML_QUANT_SIZES[qtype]
    raw = gguf_quantize(w.numpy().astype(np.float32), qtype)
    back = gguf_dequantize(raw, qtype).astype(np.float32).reshape(w.shape)
    return torch.from_numpy(back), 8.0 * size / block


def simulate(scheme: str, w: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(w quantized by `scheme` and dequantized to float32, bits per weight stored)."""
    w = w.float().contiguous()
    if scheme in INT_SCHEMES:
        bits, granularity = INT_SCHEMES[scheme]
        codes, scales = rtn_quantize(w, bits, granularity)
        group = granularity if isinstance(granularity, int) else None
        return rtn_dequantize(codes, scales, group), bits + SCALE_BITS * scales.numel() / w.numel()
    if scheme == "nf4":
        from localchat.formats.nf4 import dequantize_nf4, quantize_nf4

        parts = quantize_nf4(w)
        return dequantize_nf4(parts), 4 + SCALE_BITS * parts["weight.absmax"].numel() / w.numel()
    if scheme in GGUF_SIM_TYPES:
        return _gguf_round_trip(w, scheme)
    known = ", ".join(list(INT_SCHEMES) + ["nf4"] + list(GGUF_SIM_TYPES))
    raise UsageError(f"unknown scheme {scheme!r} (known: {known})")
