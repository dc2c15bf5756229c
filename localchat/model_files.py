"""Check a local model file before anything loads it, and read the facts we show.

A model file is untrusted input: it may be a pickle (which runs code when loaded), a
download that stopped halfway, or garbage. validate_model_file() refuses all of these
with a typed one-line error, and returns GGUFFacts for a good file. It reads only the
GGUF header (metadata and tensor table, memory-mapped); tensor data is never copied.
pickle and torch are never imported here.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, LlamaFileType

from localchat.errors import ModelFormatError, ModelNotFoundError, UnsafeCheckpointError

GGUF_MAGIC = b"GGUF"
SUPPORTED_GGUF_VERSIONS = (2, 3)
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl"})
_GUESSED_FTYPE_FLAG = 1024  # llama.cpp ORs this into general.file_type when it guessed


@dataclass(frozen=True)
class GGUFFacts:
    """What the UI shows about a model and what memory estimates are computed from."""

    path: Path
    file_size: int
    name: str
    architecture: str
    quant_type: str
    context_length: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """KV-cache bytes one token costs: K and V, for every layer and KV head."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_value


def validate_model_file(path: str | Path) -> GGUFFacts:
    """Refuse anything that is not a complete GGUF file; return its facts.

    Raises ModelNotFoundError, UnsafeCheckpointError or ModelFormatError.
    """
    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelNotFoundError(f"model file not found: {path} (it is a directory)")
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise _unsafe(path, f"{path.suffix} files are")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        file_size = path.stat().st_size
    except OSError as e:
        raise ModelNotFoundError(f"cannot read model file: {path} ({e.strerror or e})") from e

    if _is_pickle_or_zip(head):
        raise _unsafe(path, "its content is")
    if path.suffix.lower() == ".safetensors":
        raise ModelFormatError(
            f"{path}: safetensors models need the torch engine (not available yet)"
        )
    if head[:4] != GGUF_MAGIC:
        raise ModelFormatError(f"{path} is not a GGUF file (magic {head[:4]!r})")
    if len(head) < 8:
        raise ModelFormatError(f"{path} is truncated or corrupt (file ends inside the header)")
    version = _gguf_version(head[4:8])
    if version not in SUPPORTED_GGUF_VERSIONS:
        raise ModelFormatError(
            f"{path}: unsupported GGUF version {version} (supported: 2 and 3)"
        )

    try:
        reader = _HeaderReader(path)
        for t in reader.tensors:
            if t.data_offset + t.n_bytes > file_size:
                raise ValueError(f"tensor {t.name} runs past the end of the file")
        return _facts(reader, path, file_size)
    except ModelFormatError:
        raise
    except Exception as e:  # GGUFReader raises ValueError/IndexError/KeyError/... on garbage
        raise ModelFormatError(
            f"{path} is truncated or corrupt ({type(e).__name__}: {_one_line(e)})"
        ) from e


def _unsafe(path: Path, what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"refusing {path}: {what} a pickle/zip checkpoint, which can run code when loaded "
        "and is never unpickled; use a GGUF file instead"
    )


def _is_pickle_or_zip(head: bytes) -> bool:
    """Pickle protocol 2-5 starts with PROTO (0x80) + version; torch.save zips start PK."""
    pickle = len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
    return pickle or head[:4] == b"PK\x03\x04"


def _gguf_version(raw: bytes) -> int:
    """The version as the file means it; big-endian files read as a huge little one."""
    version = int.from_bytes(raw, "little")
    if version & 0xFFFF == 0:
        version = int.from_bytes(raw, "big")
    return version


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else "no details"


class _HeaderReader(GGUFReader):
    """GGUFReader that reads arrays in one piece instead of element by element.

    The stock reader builds one numpy view per vocabulary entry (~100k of them), which
    takes seconds; here scalar arrays are one view and string arrays keep only their
    start offsets and lengths (the last two parts of the field; see _string_at).
    """

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[np.ndarray], list[int], list[GGUFValueType]]:
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        if len(raw_itype) != 1 or len(alen) != 1:
            raise ValueError("file ends inside an array header")
        itype, count, offs = GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
        types = [GGUFValueType.ARRAY, itype]
        if itype == GGUFValueType.STRING:
            starts, lengths, end = self._scan_strings(offs, count)
            return end - orig_offs, [raw_itype, alen, starts, lengths], [], types
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is None:  # nested arrays: rare and small, let the stock code do it
            return super()._get_field_parts(orig_offs, raw_type)
        values = self._get(offs, nptype, count)
        if len(values) != count:
            raise ValueError("file ends inside an array")
        return 12 + int(values.nbytes), [raw_itype, alen, values], [2], types

    def _scan_strings(self, offs: int, count: int) -> tuple[np.ndarray, np.ndarray, int]:
        host_little = np.little_endian
        little = host_little if self.byte_order == "I" else not host_little
        fmt = "<Q" if little else ">Q"
        buf, size = memoryview(self.data), len(self.data)
        if count * 8 > size - offs:  # each string needs at least its length prefix
            raise ValueError("string array is longer than the file")
        starts = np.empty(count, dtype=np.uint64)
        lengths = np.empty(count, dtype=np.uint64)
        for i in range(count):
            if offs + 8 > size:
                raise ValueError("file ends inside a string array")
            (n,) = struct.unpack_from(fmt, buf, offs)
            offs += 8
            if offs + n > size:
                raise ValueError("file ends inside a string array")
            starts[i], lengths[i] = offs, n
            offs += n
        return starts, lengths, offs

    def string_at(self, key: str, index: int) -> str | None:
        """Element `index` of a string-array field, or None when absent/out of range."""
        field = self.fields.get(key)
        if field is None or field.types[:2] != [GGUFValueType.ARRAY, GGUFValueType.STRING]:
            return None
        starts, lengths = field.parts[-2], field.parts[-1]
        if not 0 <= index < len(starts):
            return None
        start = int(starts[index])
        return bytes(self.data[start : start + int(lengths[index])]).decode("utf-8", "replace")

    def string_array_len(self, key: str) -> int:
        field = self.fields.get(key)
        if field is None or field.types[:2] != [GGUFValueType.ARRAY, GGUFValueType.STRING]:
            return 0
        return len(field.parts[-2])

    def scalar(self, key: str) -> Any:
        """A non-array metadata value (int, float, bool or str), or None when absent."""
        field = self.fields.get(key)
        if field is None or not field.types or field.types[0] == GGUFValueType.ARRAY:
            return None
        return field.contents()


def _facts(reader: _HeaderReader, path: Path, file_size: int) -> GGUFFacts:
    arch = reader.scalar("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFormatError(f"{path}: GGUF file has no general.architecture")

    def num(key: str, default: int = 0) -> int:
        value = reader.scalar(key)
        if value is None:
            return default
        if isinstance(value, str):
            raise ModelFormatError(f"{path}: metadata {key} should be a number, got {value!r}")
        return int(value)

    n_heads = num(f"{arch}.attention.head_count")
    n_embd = num(f"{arch}.embedding_length")
    head_dim = num(f"{arch}.attention.key_length") or (n_embd // n_heads if n_heads else 0)
    vocab_size = num(f"{arch}.vocab_size") or reader.string_array_len("tokenizer.ggml.tokens")
    template = reader.scalar("tokenizer.chat_template")
    bos_id, eos_id = reader.scalar("tokenizer.ggml.bos_token_id"), reader.scalar("tokenizer.ggml.eos_token_id")
    name = reader.scalar("general.name")
    return GGUFFacts(
        path=path,
        file_size=file_size,
        name=name if isinstance(name, str) and name.strip() else path.stem,
        architecture=arch,
        quant_type=_quant_type(reader),
        context_length=num(f"{arch}.context_length"),
        n_layers=num(f"{arch}.block_count"),
        n_heads=n_heads,
        n_kv_heads=num(f"{arch}.attention.head_count_kv", n_heads),
        head_dim=head_dim,
        vocab_size=vocab_size,
        chat_template=template if isinstance(template, str) and template else None,
        bos_token=reader.string_at("tokenizer.ggml.tokens", bos_id) if isinstance(bos_id, int) else None,
        eos_token=reader.string_at("tokenizer.ggml.tokens", eos_id) if isinstance(eos_id, int) else None,
    )


def _quant_type(reader: _HeaderReader) -> str:
    """general.file_type as llama.cpp names it; else the type holding the most bytes."""
    ftype = reader.scalar("general.file_type")
    if isinstance(ftype, int) and not isinstance(ftype, bool):
        try:
            name = LlamaFileType(ftype & ~_GUESSED_FTYPE_FLAG).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    weights: Counter[str] = Counter()
    for t in reader.tensors:
        weights[t.tensor_type.name] += t.n_bytes
    return weights.most_common(1)[0][0] if weights else "unknown"
