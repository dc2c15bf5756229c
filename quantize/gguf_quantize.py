"""GGUF -> GGUF in another type: gguf-py's quantizers for the plain types (with llama.cpp's
per-tensor choices), llama.cpp's own quantizer for its K-quant mixes. Metadata is kept and
tensors are written one at a time, so memory stays at one tensor."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as FT
from gguf.quants import quant_shape_to_byte_shape, quantize

from localchat.errors import EngineError, UsageError
from localchat.models.files import validate_model_file
from localchat.models.gguf_reader import read_gguf
from quantize.gguf_convert import dequantize_gguf
from quantize.gguf_copy import copy_metadata, float32, shape_of
from quantize.llama_cpp_process import quantize_in_child
from quantize.progress import Progress
from quantize.safe_output import atomic_output_file

PLAIN_TYPES: dict[str, tuple[FT, Q]] = {
    "F32": (FT.ALL_F32, Q.F32), "F16": (FT.MOSTLY_F16, Q.F16), "BF16": (FT.MOSTLY_BF16, Q.BF16),
    "Q8_0": (FT.MOSTLY_Q8_0, Q.Q8_0), "Q4_0": (FT.MOSTLY_Q4_0, Q.Q4_0),
    "Q4_1": (FT.MOSTLY_Q4_1, Q.Q4_1), "Q5_0": (FT.MOSTLY_Q5_0, Q.Q5_0),
    "Q5_1": (FT.MOSTLY_Q5_1, Q.Q5_1),
}
LLAMA_CPP_TYPES: dict[str, FT] = {
    name: FT[f"MOSTLY_{name}"] for name in (
        "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K")
}
GGUF_TYPES = tuple(PLAIN_TYPES) + tuple(LLAMA_CPP_TYPES)
QUANTIZED_PLAIN = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)


def tensor_type(name: str, shape: tuple[int, ...], base: Q, has_output: bool) -> Q:
    """The type llama.cpp would give this tensor in a `base` file (rows last in shape)."""
    if len(shape) < 2:
        return Q.F32
    block = gguf.GGML_QUANT_SIZES[base][0]
    if shape[-1] % block:
        return Q.F16
    is_output = name == "output.weight" or (not has_output and name == "token_embd.weight")
    if is_output and base in QUANTIZED_PLAIN and base != Q.Q8_0:
        return Q.Q8_0
    return base


def _encode(data: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.F32:
        return np.ascontiguousarray(data, dtype=np.float32)
    if qtype == Q.F16:
        return data.astype(np.float16)
    return quantize(data, qtype)


def write_plain(src: Path, out: Path, type_name: str, threads: int | None = None) -> Path:
    """Write `out` (a temporary name the caller renames): `src` with plain type `type_name`."""
    file_type, base = PLAIN_TYPES[type_name]
    facts = validate_model_file(src)
    reader = read_gguf(src)
    writer = gguf.GGUFWriter(str(out), facts.architecture)
    try:
        copy_metadata(reader, writer, {"general.file_type": int(file_type)})
        if base in QUANTIZED_PLAIN and "general.quantization_version" not in reader.metadata:
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        plan = []
        for name in reader.tensors:
            shape = shape_of(reader, name)
            qtype = tensor_type(name, shape, base, "output.weight" in reader.tensors)
            plan.append((name, qtype))
            if qtype in (Q.F32, Q.F16):
                dtype = np.float32 if qtype == Q.F32 else np.float16
                writer.add_tensor_info(name, shape, np.dtype(dtype),
                                       int(np.prod(shape)) * np.dtype(dtype).itemsize)
            else:
                byte_shape = quant_shape_to_byte_shape(shape, qtype)
                writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8),
                                       int(np.prod(byte_shape)), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        bar = Progress(f"quantizing to {type_name}", len(plan))
        for name, qtype in plan:
            writer.write_tensor_data(_encode(float32(reader, name), qtype))
            bar.advance(note=name)
        bar.close()
    finally:
        writer.close()
        reader.close()
    return out


def write_llama_cpp(src: Path, out: Path, type_name: str, threads: int | None = None) -> Path:
    """llama.cpp's quantizer, which wants F32/F16 input: a float32 copy is written
    beside `out` first (and removed afterwards, whatever happens)."""
    validate_model_file(src)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".localchat-quantize-") as tmp:
        f32 = dequantize_gguf(src, Path(tmp) / "float32.gguf")
        bar = Progress(f"quantizing to {type_name} (llama.cpp)", 1)
        rc = quantize_in_child(f32, out, int(LLAMA_CPP_TYPES[type_name]), threads or 0)
        bar.advance()
        bar.close()
    if rc != 0:
        raise EngineError(f"llama.cpp's quantizer failed on {src.name} (code {rc})")
    return out


def quantize_gguf(src: str | Path, out: str | Path, type_name: str,
                  threads: int | None = None) -> Path:
    """Write `out` atomically (the caller has checked that it is not `src`)."""
    src, out = Path(src), Path(out)
    if type_name in PLAIN_TYPES:
        write = write_plain
    elif type_name in LLAMA_CPP_TYPES:
        write = write_llama_cpp
    else:
        raise UsageError(f"unknown GGUF type {type_name!r} (known: {', '.join(GGUF_TYPES)})")
    with atomic_output_file(out) as tmp:
        write(src, tmp, type_name, threads)
    validate_model_file(out)
    return out
