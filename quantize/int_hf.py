"""A Hugging Face directory -> INT8 (per row) or INT4 (per group) safetensors (symmetric
absmax, float32 scales) in the layout localchat/formats/intq.py describes; the layout is
in docs/architecture.md (Decisions)."""

from __future__ import annotations

from pathlib import Path

import torch

from localchat.formats.intq import QUANT_METHOD, SCALE_SUFFIX, pack_int4
from localchat.errors import UsageError
from quantize.hf_rewrite import rewrite_projections
from quantize.schemes import rtn_quantize

GROUP_SIZES = (32, 64, 128, 256)


def quantization_config(bits: int, group_size: int | None) -> dict:
    return {"quant_method": QUANT_METHOD, "bits": bits, "group_size": group_size,
            "symmetric": True, "scale_dtype": "float32"}


def encode_int(w: torch.Tensor, bits: int, group_size: int | None) -> dict[str, torch.Tensor]:
    codes, scales = rtn_quantize(w.float(), bits, group_size or "row")
    stored = codes if bits == 8 else pack_int4(codes)
    return {"weight": stored.contiguous(), "weight" + SCALE_SUFFIX: scales.contiguous()}


def quantize_hf_dir_to_int(src: str | Path, dst: str | Path, bits: int,
                           group_size: int | None = None) -> Path:
    """Write `dst` (new): INT8 per row (group_size None) or INT4 per `group_size`."""
    if bits == 8 and group_size is not None:
        raise UsageError("int8 is per row: --group-size applies to int4")
    if bits == 4 and group_size not in GROUP_SIZES:
        raise UsageError(f"int4 group size must be one of {', '.join(map(str, GROUP_SIZES))}, "
                         f"got {group_size}")
    return rewrite_projections(src, dst, lambda name, w: encode_int(w, bits, group_size),
                               quantization_config(bits, group_size), label=f"INT{bits}")
