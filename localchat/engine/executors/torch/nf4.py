"""NF4 weights in bitsandbytes' safetensors layout (as transformers saves them), run without
bitsandbytes: w[i] = quant_map[code[i]] · absmax[i // blocksize]."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from localchat.errors import EngineError

# bitsandbytes' get_4bit_type("nf4"): normal-distribution quantiles scaled to [-1, 1]
NF4_LEVELS = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
QUANT_STATE_KEY = "quant_state.bitsandbytes__nf4"
NF4_SUFFIXES = ("absmax", "quant_map", "nested_absmax", "nested_quant_map", QUANT_STATE_KEY)


def nf4_table() -> torch.Tensor:
    return torch.tensor(NF4_LEVELS, dtype=torch.float32)


def read_quant_state(packed: torch.Tensor) -> dict:
    """The JSON object bitsandbytes packs into a uint8 tensor (pack_dict_to_tensor)."""
    try:
        state = json.loads(bytes(packed.to(torch.uint8).flatten().tolist()).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        state = None
    if not isinstance(state, dict):
        raise EngineError("an NF4 weight's quant_state is not a JSON object")
    return state


@dataclass
class NF4Matrix:
    """One NF4 matrix as loaded: packed codes [rows, cols/2], absmax [rows, cols/blocksize]."""

    codes: torch.Tensor
    absmax: torch.Tensor
    levels: torch.Tensor  # [16]
    blocksize: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * 2


def load_nf4(get: Callable[[str], torch.Tensor | None], name: str) -> NF4Matrix | torch.Tensor:
    """Read `name` (the packed weight) and its quant-state tensors through `get` (None for a missing
    tensor), expanding double-quantized absmax once. A matrix whose rows are not whole blocks comes
    back dequantized (float32)."""
    state = read_quant_state(_need(get, f"{name}.{QUANT_STATE_KEY}"))
    if state.get("quant_type") != "nf4":
        raise EngineError(f"{name}: 4-bit type {state.get('quant_type')!r} is not supported "
                          "(only nf4)")
    shape, blocksize = state.get("shape"), state.get("blocksize")
    if (not isinstance(shape, list) or len(shape) != 2 or type(blocksize) is not int
            or blocksize <= 0 or blocksize % 2):
        raise EngineError(f"{name}: bad NF4 quant_state (shape {shape!r}, blocksize {blocksize!r})")
    rows, cols = shape
    n = rows * cols
    packed = _need(get, name).flatten()
    if packed.dtype != torch.uint8 or packed.numel() != (n + 1) // 2:
        raise EngineError(f"{name}: {packed.numel()} packed bytes for a {rows}x{cols} NF4 matrix")
    levels = _need(get, f"{name}.quant_map").float().flatten()
    if levels.numel() != 16:
        raise EngineError(f"{name}: quant_map has {levels.numel()} entries, not 16")
    absmax = _need(get, f"{name}.absmax")
    n_blocks = -(-n // blocksize)
    if "nested_absmax" in state or get(f"{name}.nested_absmax") is not None:
        absmax = _nested_absmax(get, name, state, absmax, n_blocks)
    absmax = absmax.float().flatten()
    if absmax.numel() != n_blocks:
        raise EngineError(f"{name}: {absmax.numel()} absmax values for {n_blocks} blocks")
    if cols % blocksize:
        padded = F.pad(packed, (0, n_blocks * blocksize // 2 - packed.numel()))
        flat = NF4Matrix(padded.reshape(1, -1), absmax.reshape(1, -1), levels, blocksize)
        return dequantize(flat).flatten()[:n].reshape(rows, cols)
    return NF4Matrix(packed.reshape(rows, cols // 2), absmax.reshape(rows, cols // blocksize),
                     levels, blocksize)


def _need(get: Callable[[str], torch.Tensor | None], name: str) -> torch.Tensor:
    t = get(name)
    if t is None:
        raise EngineError(f"NF4 weight lacks tensor {name!r}")
    return t


def _nested_absmax(get, name: str, state: dict, codes: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Double quantization: absmax = dynamic_map[code] · nested_absmax[block] + offset."""
    nested = _need(get, f"{name}.nested_absmax").float().flatten()
    dynamic = _need(get, f"{name}.nested_quant_map").float().flatten()
    block, offset = state.get("nested_blocksize"), state.get("nested_offset")
    if type(block) is not int or block <= 0 or not isinstance(offset, (int, float)):
        raise EngineError(f"{name}: bad double-quantization state")
    codes = codes.flatten()
    if codes.dtype != torch.uint8 or codes.numel() != n_blocks or dynamic.numel() != 256 \
            or nested.numel() != -(-n_blocks // block):
        raise EngineError(f"{name}: double-quantized absmax does not fit the matrix")
    scale = nested.repeat_interleave(block)[:n_blocks]
    return dynamic[codes.long()] * scale + float(offset)


def byte_table(levels: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[256, 2]: the two weights (high nibble, low nibble) each packed byte stands for."""
    return torch.stack([levels.repeat_interleave(16), levels.repeat(16)], dim=-1).to(dtype)


def dequantize(m: NF4Matrix, rows: slice = slice(None), dtype=torch.float32,
               table: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of the matrix as dense `dtype`: one gather through the byte table, then one
    multiply by each block's absmax."""
    table = byte_table(m.levels, dtype) if table is None else table
    return dequantize_codes(m.codes[rows], m.absmax[rows], table, m.blocksize)


def dequantize_codes(codes: torch.Tensor, absmax: torch.Tensor, table: torch.Tensor,
                     blocksize: int) -> torch.Tensor:
    """Packed codes [n, cols/2] and their absmax [n, cols/blocksize] as dense rows in the
    byte table's dtype."""
    n = codes.shape[0]
    w = table.index_select(0, codes.flatten().int()).view(n, absmax.shape[1], blocksize)
    return (w * absmax.to(table.dtype)[..., None]).view(n, -1)


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


def stack_nf4(matrices: list[NF4Matrix]) -> NF4Matrix:
    """Matrices stacked by rows (fused q/k/v, gate/up): exact, since every block lies
    inside one row (load_nf4 checks cols % blocksize == 0)."""
    first = matrices[0]
    for m in matrices[1:]:
        if (m.shape[1] != first.shape[1] or m.blocksize != first.blocksize
                or not torch.equal(m.levels, first.levels)):
            raise EngineError("NF4 matrices to fuse differ in width, block size or levels")
    return NF4Matrix(torch.cat([m.codes for m in matrices]),
                     torch.cat([m.absmax for m in matrices]), first.levels, first.blocksize)
