"""Read a GGUF file without trusting it: read_gguf() memory-maps it and checks every count, length,
type, offset and size against the bytes there before use (GGUFFormatError names the field).
Tensor data is never read here, only sliced zero-copy by GGUFFile.tensor_data()."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from localchat.errors import ModelFormatError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # v2 and v3 share the layout; v1 used 32-bit counts
MAX_STRING_BYTES = 64 << 20  # keys, values and each array string (llama.cpp: 1 GiB)
MAX_TENSOR_NAME_BYTES = 63  # ggml's GGML_MAX_NAME is 64 bytes including the NUL
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
INT64_MAX = 2**63 - 1  # ggml keeps dims and sizes in int64
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-byte key, value type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name len, name, n_dims, a dim, type, offset

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_T = GGUFValueType
# value type -> (reader, size, numpy dtype for arrays)
_SCALARS: dict[int, tuple[struct.Struct, int, str]] = {
    _T.UINT8: (struct.Struct("<B"), 1, "<u1"),
    _T.INT8: (struct.Struct("<b"), 1, "<i1"),
    _T.UINT16: (struct.Struct("<H"), 2, "<u2"),
    _T.INT16: (struct.Struct("<h"), 2, "<i2"),
    _T.UINT32: (struct.Struct("<I"), 4, "<u4"),
    _T.INT32: (struct.Struct("<i"), 4, "<i4"),
    _T.FLOAT32: (struct.Struct("<f"), 4, "<f4"),
    _T.BOOL: (struct.Struct("<B"), 1, "<u1"),
    _T.UINT64: (struct.Struct("<Q"), 8, "<u8"),
    _T.INT64: (struct.Struct("<q"), 8, "<i8"),
    _T.FLOAT64: (struct.Struct("<d"), 8, "<f8"),
}


class GGUFFormatError(ModelFormatError):
    """A GGUF file failed a check; .field names what was wrong ("kv[3].key", ...)."""

    def __init__(self, path: str | Path, field: str, problem: str,
                 lead: str = "is truncated or corrupt") -> None:
        self.path = str(path)
        self.field = _one_line(field)
        self.problem = _one_line(problem)
        self.lead = lead
        super().__init__(_one_line(f"{path} {lead} ({self.field}: {self.problem})"))

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:
        return type(self), (self.path, self.field, self.problem, self.lead)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor table entry; shape in ggml order (ne0, the row length, first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    type_name: str
    offset: int  # absolute, from the start of the file
    n_bytes: int
    n_elements: int


class GGUFFile:
    """A parsed, checked GGUF file; keeps the mmap open for tensor_data() until close()."""

    def __init__(self, path: Path, file_size: int, version: int, alignment: int,
                 data_offset: int, metadata: dict[str, Any],
                 tensors: dict[str, TensorInfo], mm: mmap.mmap,
                 value_types: dict[str, tuple[int, int | None]] | None = None) -> None:
        self.path = path
        self.file_size = file_size
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset
        self.metadata = metadata
        self.value_types = value_types or {}  # key -> (value type, array item type or None)
        self.tensors = tensors
        self._mm: mmap.mmap | None = mm
        self._buf: np.ndarray | None = np.frombuffer(mm, dtype=np.uint8)

    def tensor_data(self, name: str) -> np.ndarray:
        """The tensor's bytes: a read-only uint8 view of the mapped file (no copy)."""
        if self._buf is None:
            raise ValueError(f"{self.path} is closed")
        t = self.tensors[name]
        return self._buf[t.offset : t.offset + t.n_bytes]

    def close(self) -> None:
        """Unmap now, or once the last tensor_data() view is garbage (if any are alive)."""
        self._buf = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # views still export the buffer; they keep it mapped
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and check a GGUF file's header, metadata and tensor table.

    Raises GGUFFormatError (a ModelFormatError) for any bad or truncated field and
    ModelNotFoundError when the file cannot be opened.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise GGUFFormatError(path, "header.magic", "the file is empty")
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ModelNotFoundError(f"cannot read model file: {path} ({e.strerror or e})") from e
    try:
        return _Parser(path, mm).parse()
    except BaseException:
        mm.close()
        raise


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _one_line(text: str) -> str:
    """Escape control characters: names from the file must not break the one-line rule."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _show(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else name[:limit] + "..."


class _Parser:
    """A cursor over the mapped file; every read checks the bytes left first."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path, self.mm, self.size, self.pos = path, mm, len(mm), 0
        self.types: dict[str, int] = {}  # value type of each key, as stored
        self.item_types: dict[str, int] = {}  # item type of each array key

    def fail(self, field: str, problem: str,
             lead: str = "is truncated or corrupt") -> GGUFFormatError:
        return GGUFFormatError(self.path, field, problem, lead)

    @property
    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, field: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(field, f"the file ends here (needs {n} bytes at offset "
                                   f"{self.pos}, {self.size - self.pos} left)")

    def u32(self, field: str) -> int:
        self.need(4, field)
        (v,) = _U32.unpack_from(self.mm, self.pos)
        self.pos += 4
        return v

    def u64(self, field: str) -> int:
        self.need(8, field)
        (v,) = _U64.unpack_from(self.mm, self.pos)
        self.pos += 8
        return v

    def string(self, field: str, cap: int = MAX_STRING_BYTES) -> str:
        n = self.u64(field)
        if n > cap:
            raise self.fail(field, f"string length {n} is over the cap of {cap} bytes")
        self.need(n, field)
        raw = self.mm[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(field, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def count(self, field: str, n: int, min_bytes: int, what: str) -> None:
        """Reject a count the rest of the file cannot hold, before any list is built."""
        if n > self.left // min_bytes:
            raise self.fail(field, f"{n} {what} cannot fit in the {self.left} bytes left "
                                   f"(each needs at least {min_bytes})")

    def parse(self) -> GGUFFile:
        version = self.header()
        tensor_count = self.u64("header.tensor_count")
        kv_count = self.u64("header.kv_count")
        self.count("header.kv_count", kv_count, _MIN_KV_BYTES, "key/value pairs")
        self.count("header.tensor_count", tensor_count, _MIN_TENSOR_INFO_BYTES, "tensor infos")
        metadata = self.metadata(kv_count)
        alignment = self.alignment(metadata)
        self.count("header.tensor_count", tensor_count, _MIN_TENSOR_INFO_BYTES, "tensor infos")
        tensors = self.tensor_infos(tensor_count, alignment)
        data_offset = _align(self.pos, alignment)
        tensors = [replace(t, offset=data_offset + t.offset) for t in tensors]
        for t in tensors:
            if t.offset + t.n_bytes > self.size:
                raise self.fail(f"tensor '{_show(t.name)}'.data",
                                f"bytes {t.offset}..{t.offset + t.n_bytes} run past the end "
                                f"of the file ({self.size} bytes)")
        value_types = {k: (t, self.item_types.get(k)) for k, t in self.types.items()}
        return GGUFFile(self.path, self.size, version, alignment, data_offset, metadata,
                        {t.name: t for t in tensors}, self.mm, value_types)

    def header(self) -> int:
        self.need(4, "header.magic")
        magic = self.mm[0:4]
        if magic != GGUF_MAGIC:
            raise self.fail("header.magic", f"expected b'GGUF', found {magic!r}",
                            lead="is not a GGUF file")
        self.pos = 4
        version = self.u32("header.version")
        if version in SUPPORTED_VERSIONS:
            return version
        if int.from_bytes(_U32.pack(version), "big") in SUPPORTED_VERSIONS:
            raise self.fail("header.version", f"version reads as {version}; only "
                            "little-endian files are supported",
                            lead="is a big-endian/byte-swapped GGUF file")
        raise self.fail("header.version", f"{version} (supported: 2 and 3)",
                        lead="uses an unsupported GGUF version")

    def metadata(self, kv_count: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        for i in range(kv_count):
            key = self.string(f"kv[{i}].key")
            if not key:
                raise self.fail(f"kv[{i}].key", "empty key")
            if key in metadata:
                raise self.fail(f"kv[{i}].key", f"duplicate key '{_show(key)}'")
            field = _show(key)
            vtype = self.types[key] = self.u32(f"{field}.type")
            if vtype == _T.ARRAY:
                self.item_types[key] = int.from_bytes(self.mm[self.pos:self.pos + 4], "little")
            metadata[key] = self.value(field, vtype)
        return metadata

    def value(self, field: str, vtype: int) -> Any:
        if vtype == _T.STRING:
            return self.string(field)
        scalar = _SCALARS.get(vtype)
        if scalar is not None:
            reader, n, _ = scalar
            self.need(n, field)
            (v,) = reader.unpack_from(self.mm, self.pos)
            self.pos += n
            if vtype == _T.BOOL:
                if v > 1:
                    raise self.fail(field, f"bool value is {v}, not 0 or 1")
                return bool(v)
            return v
        if vtype == _T.ARRAY:
            return self.array(field)
        raise self.fail(f"{field}.type", f"unknown value type {vtype}")

    def array(self, field: str) -> Any:
        itype = self.u32(f"{field}.array_type")
        n = self.u64(f"{field}.count")
        if itype == _T.ARRAY:
            raise self.fail(f"{field}.array_type", "arrays of arrays are not supported")
        if itype == _T.STRING:
            self.count(f"{field}.count", n, 8, "strings")
            return self.strings(field, n)
        scalar = _SCALARS.get(itype)
        if scalar is None:
            raise self.fail(f"{field}.array_type", f"unknown value type {itype}")
        _, size, dtype = scalar
        self.count(f"{field}.count", n, size, "elements")
        values = np.frombuffer(self.mm, dtype=dtype, count=n, offset=self.pos).copy()
        self.pos += n * size
        if itype == _T.BOOL:
            if n and int(values.max()) > 1:
                raise self.fail(field, "bool array holds a value other than 0 or 1")
            return values.astype(np.bool_)
        return values

    def strings(self, field: str, n: int) -> list[str]:
        """The hot loop (vocabularies of 100k+ entries): locals only, no per-item numpy."""
        mm, size, pos, cap = self.mm, self.size, self.pos, MAX_STRING_BYTES
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        i = 0
        try:
            for i in range(n):
                if pos + 8 > size:
                    self.pos = pos
                    self.need(8, f"{field}[{i}]")
                (length,) = unpack(mm, pos)
                pos += 8
                if length > cap or length > size - pos:
                    self.pos = pos
                    raise self.fail(f"{field}[{i}]", f"string length {length} is over the cap "
                                    f"of {cap} bytes or the {size - pos} bytes left")
                append(mm[pos : pos + length].decode("utf-8"))
                pos += length
        except UnicodeDecodeError as e:
            raise self.fail(f"{field}[{i}]", f"not valid UTF-8 ({e.reason})") from None
        self.pos = pos
        return out

    def alignment(self, metadata: dict[str, Any]) -> int:
        """general.alignment must be a u32 power of two; llama.cpp once wrapped to 0 on it."""
        if "general.alignment" not in metadata:
            return DEFAULT_ALIGNMENT
        value, vtype = metadata["general.alignment"], self.types["general.alignment"]
        if vtype != _T.UINT32:
            raise self.fail("general.alignment", f"must be stored as UINT32, not {_T(vtype).name}")
        if value == 0 or value & (value - 1) or value > MAX_ALIGNMENT:
            raise self.fail("general.alignment",
                            f"{value} is not a power of two between 1 and {MAX_ALIGNMENT}")
        return value

    def tensor_infos(self, n: int, alignment: int) -> list[TensorInfo]:
        infos: list[TensorInfo] = []
        seen: dict[str, int] = {}
        expected = 0  # the aligned running sum of the sizes so far, relative to data
        for i in range(n):
            name = self.string(f"tensor[{i}].name", cap=MAX_TENSOR_NAME_BYTES)
            if not name:
                raise self.fail(f"tensor[{i}].name", "empty tensor name")
            label = f"tensor '{_show(name)}'"
            if name in seen:
                raise self.fail(f"{label}.name",
                                f"duplicate tensor name (also tensor[{seen[name]}])")
            seen[name] = i
            info = self.tensor_info(name, label)
            if info.offset != expected:
                raise self.fail(f"{label}.offset", f"{info.offset} is not the aligned end of the "
                                f"previous tensors ({expected})")
            expected = _align(expected + info.n_bytes, alignment)
            infos.append(info)
        return infos

    def tensor_info(self, name: str, label: str) -> TensorInfo:
        n_dims = self.u32(f"{label}.n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"{label}.n_dims", f"{n_dims} is not between 1 and {MAX_DIMS}")
        shape = tuple(self.u64(f"{label}.shape[{d}]") for d in range(n_dims))
        ggml_type = self.u32(f"{label}.type")
        offset = self.u64(f"{label}.offset")
        for d, dim in enumerate(shape):
            if dim > INT64_MAX:
                raise self.fail(f"{label}.shape[{d}]", f"dimension {dim} is negative as int64")
        sizes = GGML_QUANT_SIZES.get(ggml_type)  # type: ignore[call-overload]
        if sizes is None:
            raise self.fail(f"{label}.type", f"unknown ggml type {ggml_type}")
        block, type_size = sizes
        product = 1
        for dim in shape:
            product *= max(dim, 1)  # an empty tensor still must not overflow its strides
        if product > INT64_MAX:
            raise self.fail(f"{label}.shape", f"{shape} has more than 2^63-1 elements")
        if shape[0] % block:
            raise self.fail(f"{label}.shape[0]", f"row length {shape[0]} is not a multiple of "
                            f"the {GGMLQuantizationType(ggml_type).name} block size {block}")
        n_elements = 0 if 0 in shape else product
        n_bytes = n_elements // block * type_size
        if n_bytes > self.size:
            raise self.fail(f"{label}.shape", f"{shape} needs {n_bytes} bytes, more than the "
                            f"whole file ({self.size})")
        return TensorInfo(name, shape, ggml_type, GGMLQuantizationType(ggml_type).name,
                          offset, n_bytes, n_elements)
