"""A GGUF rewritten with every tensor dequantized exactly to float32, metadata kept, written
atomically: the reference that tells an engine's arithmetic apart from its weights' rounding."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

from localchat.errors import UsageError
from localchat.models.files import validate_model_file


def _copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, file_type: int) -> None:
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes these itself
        value = file_type if name == "general.file_type" else field.contents()
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub_type)


def dequantize_gguf(src: str | Path, dst: str | Path) -> Path:
    """Write `dst`: `src` with every tensor as float32."""
    src, dst = Path(src), Path(dst)
    facts = validate_model_file(src)  # the same checks the loaders use
    if dst.exists() and dst.resolve() == src.resolve():
        raise UsageError(f"output {dst} is the input file")
    reader = gguf.GGUFReader(str(src))
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, facts.architecture)
        _copy_metadata(reader, writer, gguf.LlamaFileType.ALL_F32)
        for tensor in reader.tensors:
            shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml lists dims fastest first
            data = np.asarray(tensor.data)
            if tensor.tensor_type != gguf.GGMLQuantizationType.F32:
                data = dequantize(data, tensor.tensor_type)
            writer.add_tensor(tensor.name, data.astype(np.float32).reshape(shape))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dst
