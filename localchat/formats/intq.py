"""localchat's INT8 (per row) and INT4 (per group) safetensors weights, as quantize/int_hf.py
writes them: w = code · scale (symmetric absmax), codes int8, or INT4 two to a byte; scales
float32 under the weight's name + SCALE_SUFFIX."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from localchat.errors import EngineError

QUANT_METHOD = "localchat-int"
SCALE_SUFFIX = "_scale"


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
    """float32 [out, in]."""
    return m.codes.float() * column_scales(m, 1)
