"""A GGUF's metadata and tensors as gguf-py's writer takes them, read through localchat's
checking reader (gguf-py's GGUFReader spends ~4 s a file on the vocabulary alone)."""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quant_shape_to_byte_shape

from localchat.models.gguf_reader import GGUFFile

WRITTEN_BY_THE_WRITER = ("general.architecture",)


def copy_metadata(src: GGUFFile, writer: gguf.GGUFWriter,
                  new: dict[str, object] | None = None, drop: tuple[str, ...] = ()) -> None:
    """Every key of `src` but `drop` with its stored type, in order; `new` replaces some
    keys' values."""
    new = new or {}
    for name, value in src.metadata.items():
        if name in WRITTEN_BY_THE_WRITER or name in drop:
            continue
        vtype, item = src.value_types[name]
        value = new.get(name, value)
        if isinstance(value, np.ndarray):
            value = value.tolist()
        writer.add_key_value(name, value, gguf.GGUFValueType(vtype),
                             sub_type=None if item is None else gguf.GGUFValueType(item))


def shape_of(src: GGUFFile, name: str) -> tuple[int, ...]:
    """The tensor's numpy shape (ggml lists the fastest dimension first)."""
    return tuple(reversed(src.tensors[name].shape))


def float32(src: GGUFFile, name: str) -> np.ndarray:
    """The tensor dequantized exactly to float32, in its numpy shape."""
    t, shape = src.tensors[name], shape_of(src, name)
    raw = src.tensor_data(name)
    if t.ggml_type == Q.F32:
        return raw.view(np.float32).reshape(shape)
    return dequantize(raw.reshape(shape[:-1] + (-1,)), Q(t.ggml_type)).astype(
        np.float32, copy=False).reshape(shape)


def add_copied_tensor(src: GGUFFile, name: str, writer: gguf.GGUFWriter) -> np.ndarray:
    """Declare `name` to the writer as stored in `src`; returns its bytes for write_tensor_data."""
    t, shape = src.tensors[name], shape_of(src, name)
    raw = src.tensor_data(name)
    qtype = Q(t.ggml_type)
    if qtype in (Q.F32, Q.F16):
        data = raw.view(np.float32 if qtype == Q.F32 else np.float16).reshape(shape)
        writer.add_tensor_info(name, shape, data.dtype, t.n_bytes)
        return data
    writer.add_tensor_info(name, quant_shape_to_byte_shape(shape, qtype), np.dtype(np.uint8),
                           t.n_bytes, raw_dtype=qtype)
    return raw
