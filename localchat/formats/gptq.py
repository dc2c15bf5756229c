"""GPTQ checkpoints (AutoGPTQ / transformers' GPTQConfig, v1 and v2): qweight, qzeros,
scales and g_idx per Linear, codes packed 32/bits to an int32 word, lowest bits first;
read (load_gptq) and written (pack_v1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from localchat.errors import EngineError

QUANT_METHOD = "gptq"
SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")
BITS = (2, 4, 8)


@dataclass(frozen=True)
class GPTQConfig:
    bits: int
    group_size: int  # -1: one group per row
    zero_offset: int  # 1 for v1 checkpoints (zero − 1 stored), 0 for v2


def gptq_config(q: dict, name: str) -> GPTQConfig:
    """config.json's quantization_config (quant_method gptq), checked."""
    bits, group = q.get("bits"), q.get("group_size", -1)
    fmt = q.get("checkpoint_format", "gptq")
    if bits not in BITS or type(group) is not int or not (group == -1 or group > 0) \
            or fmt not in ("gptq", "gptq_v2"):
        raise EngineError(f"{name}: unsupported GPTQ quantization_config (bits {bits!r}, "
                          f"group_size {group!r}, checkpoint_format {fmt!r}; supported: bits "
                          f"{'/'.join(map(str, BITS))}, checkpoint_format gptq or gptq_v2)")
    return GPTQConfig(bits, group, 1 if fmt == "gptq" else 0)


@dataclass
class GPTQMatrix:
    codes: torch.Tensor  # int32 [out, in], 0..2^bits − 1
    scales: torch.Tensor  # float32 [groups, out]
    zeros: torch.Tensor  # int32 [groups, out], the real zero points
    g_idx: torch.Tensor  # int64 [in]
    bits: int
    group_size: int  # from quantization_config (in features when it says -1)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)


def unpack(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words -> int32 codes, 32/bits per word along `dim`, lowest bits first."""
    per = 32 // bits
    words = packed.view(torch.uint32).to(torch.int64) if packed.dtype == torch.int32 else packed.to(torch.int64)
    words = words.movedim(dim, -1)
    codes = torch.stack([(words >> (bits * i)) & (2 ** bits - 1) for i in range(per)], dim=-1)
    return codes.reshape(*words.shape[:-1], -1).to(torch.int32).movedim(-1, dim)


def load_gptq(get: Callable[[str], torch.Tensor | None], prefix: str,
              config: GPTQConfig) -> GPTQMatrix:
    """The matrix stored under `prefix` ("model.layers.0.self_attn.q_proj."), checked."""
    qweight, qzeros, scales, g_idx = (get(prefix + s) for s in SUFFIXES)
    label = prefix.rstrip(".")
    if qweight is None or qzeros is None or scales is None:
        raise EngineError(f"{label}: GPTQ weight lacks its qweight, qzeros or scales")
    per = 32 // config.bits
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32 or qweight.dim() != 2 \
            or qzeros.dim() != 2 or scales.dim() != 2 or not scales.dtype.is_floating_point:
        raise EngineError(f"{label}: GPTQ tensors have the wrong types or ranks")
    n_in, n_out = qweight.shape[0] * per, qweight.shape[1]
    if g_idx is None:  # older checkpoints without act-order omit it
        g_idx = torch.arange(n_in) // (n_in if config.group_size == -1 else config.group_size)
    g_idx = g_idx.to(torch.int64)
    groups = scales.shape[0]
    if tuple(scales.shape) != (groups, n_out) or tuple(qzeros.shape) != (groups, n_out // per) \
            or n_out % per or tuple(g_idx.shape) != (n_in,) \
            or bool((g_idx < 0).any() or (g_idx >= groups).any()):
        raise EngineError(f"{label}: GPTQ shapes do not fit (qweight {list(qweight.shape)}, "
                          f"qzeros {list(qzeros.shape)}, scales {list(scales.shape)}, "
                          f"g_idx {list(g_idx.shape)}, {config.bits} bits)")
    codes = unpack(qweight, config.bits, 0).t().contiguous()  # [out, in]
    # v1: a stored 2^bits − 1 reads as zero 2^bits, as in every v1 loader (the writers
    # cannot store a zero of 0; quantize/gptq.py never produces one)
    zeros = unpack(qzeros, config.bits, 1) + config.zero_offset
    return GPTQMatrix(codes, scales.float(), zeros, g_idx, config.bits,
                      n_in if config.group_size == -1 else config.group_size)


def dequantize_gptq(m: GPTQMatrix) -> torch.Tensor:
    """float32 [out, in]."""
    s, z = m.scales[m.g_idx].t(), m.zeros[m.g_idx].t()
    return s * (m.codes - z).float()


def sequential_group(m: GPTQMatrix) -> int | None:
    """The group size when g_idx is i // group_size for every column, else None."""
    if torch.equal(m.g_idx, torch.arange(m.shape[1]) // m.group_size):
        return m.group_size
    return None


def gptq_matrices(keys, get: Callable[[str], torch.Tensor | None], config: GPTQConfig):
    """(weight name, GPTQMatrix, stored tensor names) for every GPTQ Linear among `keys`."""
    for key in sorted(k for k in keys if k.endswith(".qweight")):
        prefix = key[: -len("qweight")]
        yield prefix + "weight", load_gptq(get, prefix, config), \
            [prefix + s for s in SUFFIXES if prefix + s in keys]


def pack_v1(r, bits: int = 4) -> dict[str, torch.Tensor]:
    """r's codes [rows, cols], zeros and scales [groups, rows] and g_idx (quantize/gptq.py's
    GPTQResult) as AutoGPTQ's v1 tensors: qweight int32 [cols·bits/32, rows] (column-major
    packing, lowest bits first), qzeros int32 [groups, rows·bits/32] holding zero − 1,
    scales float16 [groups, rows], g_idx int32 [cols]."""
    per = 32 // bits

    def pack(x: torch.Tensor) -> torch.Tensor:  # pack along dim 0
        x = x.to(torch.int64).reshape(-1, per, *x.shape[1:])
        shifts = (torch.arange(per) * bits).reshape(1, per, *([1] * (x.dim() - 2)))
        return ((x << shifts).sum(dim=1) & 0xFFFFFFFF).to(torch.uint32).view(torch.int32)

    return {"qweight": pack(r.codes.t().contiguous()),
            "qzeros": pack((r.zeros - 1).t().contiguous() & (2 ** bits - 1)).t().contiguous(),
            "scales": r.scales.half(), "g_idx": r.g_idx}
