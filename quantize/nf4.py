"""NF4 quantization in bitsandbytes' exact layout, without bitsandbytes (nearest level, ties
down; optional double quantization), so our NF4 files load in transformers + bitsandbytes
and theirs in localchat."""

from __future__ import annotations

import json

import torch

from localchat.engine.executors.torch.nf4 import NF4Matrix, QUANT_STATE_KEY, dequantize, load_nf4, nf4_table

NESTED_BLOCKSIZE = 256


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


__all__ = ["NF4Matrix", "dequantize_nf4", "dynamic_map", "quantize_nf4"]
