"""The least a quantize run writes: the output at its type's bits per weight, plus the
float32 copy some routes make beside it, so a disk that cannot hold them is refused
before anything is written (a disk that fills up later still fails cleanly)."""

from __future__ import annotations

from pathlib import Path

import gguf

from localchat.models.gguf_reader import read_gguf
from localchat.models.hf_files import tensor_totals
from quantize.gguf_quantize import GGUF_TYPES, LLAMA_CPP_TYPES

DIR_BYTES_PER_WEIGHT = {"int8": 1.0, "int4": 0.5, "nf4": 0.5}


def weight_count(src: Path) -> int:
    """Stored elements of every tensor: an HF directory's headers or a GGUF's tensor table."""
    if src.is_dir():
        return tensor_totals(src)[1]
    with read_gguf(src) as g:
        return sum(t.n_elements for t in g.tensors.values())


def bytes_per_weight(type_name: str) -> float:
    """Q4_K_M -> Q4_K's block size; F16 -> 2; int8 -> 1."""
    if type_name in DIR_BYTES_PER_WEIGHT:
        return DIR_BYTES_PER_WEIGHT[type_name]
    base = type_name[:4] if type_name in LLAMA_CPP_TYPES else type_name  # Q4_K_M -> Q4_K
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[base]]
    return size / block


def min_bytes_written(src: Path, type_name: str) -> int:
    """A lower bound on the bytes `localchat quantize src --type type_name` writes."""
    n = weight_count(src)
    to_gguf = type_name in GGUF_TYPES
    float_copy = (src.is_dir() and to_gguf) or \
        (not src.is_dir() and (not to_gguf or type_name in LLAMA_CPP_TYPES))
    return int(n * bytes_per_weight(type_name)) + (4 * n if float_copy else 0)
