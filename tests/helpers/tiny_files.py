"""Small test files built on the fly (never downloaded)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_tiny_gguf(path: Path, name: str = "tiny", *, arch: str = "llama",
                    file_type: gguf.LlamaFileType = gguf.LlamaFileType.ALL_F32) -> Path:
    """A small but complete GGUF: `arch` metadata, `file_type` named, one F32 tensor."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_file_type(file_type)
    writer.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
