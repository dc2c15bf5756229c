"""A GGUF rewritten with every tensor dequantized exactly to float32, metadata kept, written
atomically: the reference that tells an engine's arithmetic apart from its weights' rounding."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import gguf

from localchat.errors import UsageError
from localchat.models.files import validate_model_file
from localchat.models.gguf_reader import read_gguf
from quantize.gguf_copy import copy_metadata, float32


def dequantize_gguf(src: str | Path, dst: str | Path) -> Path:
    """Write `dst`: `src` with every tensor as float32."""
    src, dst = Path(src), Path(dst)
    facts = validate_model_file(src)  # the same checks the loaders use
    if dst.exists() and dst.resolve() == src.resolve():
        raise UsageError(f"output {dst} is the input file")
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with read_gguf(src) as reader:
            writer = gguf.GGUFWriter(tmp, facts.architecture)
            copy_metadata(reader, writer, {"general.file_type": int(gguf.LlamaFileType.ALL_F32)})
            for name in reader.tensors:
                writer.add_tensor(name, float32(reader, name))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dst
