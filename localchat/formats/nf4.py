"""NF4 weights in bitsandbytes' safetensors layout (as transformers saves them), without
bitsandbytes: w[i] = quant_map[code[i]] · absmax[i // blocksize]. Reading (load_nf4,
dequantize) and writing (quantize_nf4: nearest level, ties down; optional double
quantization), so our NF4 files load in transformers + bitsandbytes and theirs in localchat."""

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
NESTED_BLOCKSIZE = 256  # absmax values per double-quantization block


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


def dynamic_map(signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8) -> torch.Tensor:
    """bitsandbytes' create_dynamic_map(): a sign, a dynamic exponent (leading zeros)
    and a linear fraction; 256 values in [-1, 1], computed in the same float32 steps."""
    data: list[float] = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:
        boundaries = torch.linspace(0.1, 1, additional_items + 1)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def _nearest(values: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Index of the nearest level (levels sorted); a tie goes to the lower level."""
    midpoints = (levels[1:] + levels[:-1]) / 2
    return torch.bucketize(values, midpoints, right=False)


def _blockwise(values: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values padded to whole blocks, [n_blocks, blocksize]; absmax per block)."""
    n = values.numel()
    padded = torch.nn.functional.pad(values.flatten(), (0, -n % blocksize))
    blocks = padded.view(-1, blocksize)
    return blocks, blocks.abs().amax(dim=1)


def quantize_nf4(w: torch.Tensor, blocksize: int = 64, double_quant: bool = False,
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A 2-D weight as the tensors a bitsandbytes Linear4bit saves under its prefix:
    keys "weight", "weight.absmax", "weight.quant_map", ["weight.nested_absmax",
    "weight.nested_quant_map"], "weight.quant_state.bitsandbytes__nf4".
    `dtype` is the recorded original dtype (default: w's)."""
    if w.dim() != 2 or blocksize <= 0 or blocksize % 2:
        raise ValueError("quantize_nf4 takes a 2-D weight and an even block size")
    levels = nf4_table()
    blocks, absmax = _blockwise(w.detach().float(), blocksize)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    codes = _nearest(blocks / scale[:, None], levels).to(torch.uint8).flatten()[:w.numel()]
    if codes.numel() % 2:
        codes = torch.cat([codes, codes.new_zeros(1)])
    packed = (codes[0::2] << 4) | codes[1::2]  # high nibble first
    state: dict = {"quant_type": "nf4", "blocksize": blocksize,
                   "dtype": str(dtype or w.dtype).removeprefix("torch."), "shape": list(w.shape)}
    out = {"weight": packed.view(-1, 1), "weight.absmax": absmax, "weight.quant_map": levels}
    if double_quant:
        offset = absmax.mean()
        nested_blocks, nested_absmax = _blockwise(absmax - offset, NESTED_BLOCKSIZE)
        nested_scale = torch.where(nested_absmax > 0, nested_absmax, torch.ones_like(nested_absmax))
        qabsmax = _nearest(nested_blocks / nested_scale[:, None], dynamic_map())
        out["weight.absmax"] = qabsmax.to(torch.uint8).flatten()[:absmax.numel()]
        out["weight.nested_absmax"] = nested_absmax
        out["weight.nested_quant_map"] = dynamic_map()
        state.update(nested_blocksize=NESTED_BLOCKSIZE, nested_dtype="float32",
                     nested_offset=offset.item())
    out[f"weight.{QUANT_STATE_KEY}"] = torch.tensor(list(json.dumps(state).encode("utf-8")),
                                                     dtype=torch.uint8)
    return out


def dequantize_nf4(parts: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense matrix back from quantize_nf4()'s tensors (or a file's, same keys)."""
    m = load_nf4(parts.get, "weight")
    return m.to(dtype) if isinstance(m, torch.Tensor) else dequantize(m, dtype=dtype)
