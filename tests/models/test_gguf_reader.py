"""read_gguf: one corrupt file per check (reliability cases G1-G8; G10 is in
test_gguf_metadata.py), every truncation (G9), a bounded mutation fuzz (G11), speed on
big headers (G12), and round trips against gguf-py's writer and reader."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from helpers.gguf_builder import (
    ARR, BOOL, F32, GGML_F32, GGML_Q4_0, I32, STR, TINY_TOKENS, U8, U32, U64, RawGGUF,
    bundled_path, gstr, kv, kv_array, kv_raw, load, refused, tensor_info, tiny_model, u32, u64,
)
from localchat.models.gguf_checks import check_model_metadata
from localchat.models.gguf_reader import GGUFFormatError, read_gguf


def test_tiny_model_is_valid(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["empty"] = kv_raw("general.tags", ARR, u32(STR) + u64(0))
    path = g.write(tmp_path / "tiny.gguf")
    with read_gguf(path) as f:
        check_model_metadata(f)
        assert f.version == 3 and f.alignment == 32
        assert f.metadata["tokenizer.ggml.tokens"] == TINY_TOKENS
        assert f.metadata["tokenizer.ggml.scores"].dtype == np.float32
        assert f.metadata["general.tags"] == [] and f.metadata["general.name"] == "tiny"
        embd, norm = f.tensors.values()
        assert (embd.shape, embd.type_name) == ((64, 8), "F32")
        assert (embd.n_elements, embd.n_bytes) == (512, 2048)
        assert norm.offset == f.data_offset + 2048 and norm.offset + norm.n_bytes == f.file_size
        assert f.tensor_data("token_embd.weight").view(np.float32)[5] == 5.0


def test_views_outlive_close(tmp_path: Path) -> None:
    path = tiny_model().write(tmp_path / "tiny.gguf")
    f = read_gguf(path)
    view = f.tensor_data("output_norm.weight")
    f.close()
    f.close()
    assert view.view(np.float32).tolist() == [1.0] * 64  # still mapped while referenced
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="closed"):
        f.tensor_data("output_norm.weight")


# G1: magic and version ------------------------------------------------------------------

def test_empty_file(tmp_path: Path) -> None:
    refused(tmp_path, b"", "header.magic", "empty")


def test_bad_magic(tmp_path: Path) -> None:
    g = tiny_model()
    g.magic = b"GGML"
    refused(tmp_path, g, "header.magic", "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 99, 2**32 - 1])
def test_unsupported_version(tmp_path: Path, version: int) -> None:
    g = tiny_model()
    g.version = version
    refused(tmp_path, g, "header.version", "unsupported GGUF version")


@pytest.mark.parametrize("version", [2, 3])
def test_byte_swapped_version(tmp_path: Path, version: int) -> None:
    g = tiny_model()
    g.version = int.from_bytes(struct.pack(">I", version), "little")
    refused(tmp_path, g, "header.version", "big-endian/byte-swapped")


def test_version_2_reads(tmp_path: Path) -> None:
    g = tiny_model()
    g.version = 2
    with read_gguf(g.write(tmp_path / "v2.gguf")) as f:
        assert f.version == 2 and len(f.tensors) == 2


# G2: counts -----------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["tensor_count", "kv_count"])
@pytest.mark.parametrize("count", [2**64 - 1, 2**40])
def test_huge_counts(tmp_path: Path, which: str, count: int) -> None:
    g = tiny_model()
    setattr(g, which, count)
    start = time.perf_counter()
    refused(tmp_path, g, f"header.{which}", "cannot fit")
    assert time.perf_counter() - start < 0.5


def test_kv_count_just_over_bytes_left(tmp_path: Path) -> None:
    g = RawGGUF(kv_count=(100 // 14) + 1)  # 100 bytes cannot hold 8 minimal entries
    refused(tmp_path, g.build() + b"\x00" * 100, "header.kv_count")


# G3: string lengths ---------------------------------------------------------------------

def test_key_length_over_cap(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs = {"bad": gstr(b"x", length=(64 << 20) + 1) + b"\x00" * 64, **g.kvs}
    refused(tmp_path, g, "kv[0].key", "over the cap")


def test_key_length_over_bytes_left(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["bad"] = gstr(b"general.x", length=1 << 20) + b"\x00" * 64
    refused(tmp_path, g, f"kv[{len(g.kvs) - 1}].key", "file ends")


def test_string_value_over_cap(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["general.name"] = kv_raw("general.name", STR, gstr(b"x", length=2**63))
    refused(tmp_path, g, "general.name", "over the cap")


def test_string_value_over_bytes_left(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["general.name"] = kv_raw("general.name", STR, gstr(b"tiny", length=60_000))
    refused(tmp_path, g, "general.name", "file ends")


def test_invalid_utf8_key(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["general.name"] = kv(b"general.\xff", STR, "x")
    refused(tmp_path, g, "kv[1].key", "UTF-8")


# G4: arrays -----------------------------------------------------------------------------

@pytest.mark.parametrize("itype, count", [(U32, 2**62), (U8, 2**64 - 1), (STR, 2**61)])
def test_huge_array_count(tmp_path: Path, itype: int, count: int) -> None:
    g = tiny_model()
    g.kvs["big"] = kv_raw("general.big", ARR, u32(itype) + u64(count))
    start = time.perf_counter()
    refused(tmp_path, g, "general.big.count", "cannot fit")
    assert time.perf_counter() - start < 0.5


def test_array_of_arrays(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["nested"] = kv_raw("general.nested", ARR, u32(ARR) + u64(1) + u32(U8) + u64(1) + b"\x00")
    refused(tmp_path, g, "general.nested.array_type", "arrays of arrays")


def test_string_array_lengths_past_eof(tmp_path: Path) -> None:
    g = tiny_model()
    items = gstr("a") + gstr("b") + gstr(b"c", length=10_000)
    g.kvs["tokenizer.ggml.tokens"] = kv_raw("tokenizer.ggml.tokens", ARR, u32(STR) + u64(3) + items)
    refused(tmp_path, g, "tokenizer.ggml.tokens[2]", "bytes left")


def test_string_array_bad_utf8(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["tokenizer.ggml.tokens"] = kv_array("tokenizer.ggml.tokens", STR, ["a"] * 7 + [b"\xc3("])
    refused(tmp_path, g, "tokenizer.ggml.tokens[7]", "UTF-8")


def test_unknown_array_element_type(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["odd"] = kv_raw("general.odd", ARR, u32(13) + u64(1) + b"\x00" * 8)
    refused(tmp_path, g, "general.odd.array_type", "unknown value type 13")


# G5: keys and value types ---------------------------------------------------------------

def test_empty_key(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs = {"empty": kv("", U32, 1), **g.kvs}
    refused(tmp_path, g, "kv[0].key", "empty key")


def test_duplicate_key(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["again"] = kv("llama.block_count", U32, 2)
    refused(tmp_path, g, f"kv[{len(g.kvs) - 1}].key", "duplicate key 'llama.block_count'")


@pytest.mark.parametrize("vtype", [13, 2**32 - 1])
def test_unknown_value_type(tmp_path: Path, vtype: int) -> None:
    g = tiny_model()
    g.kvs["general.name"] = kv_raw("general.name", vtype, b"\x00" * 8)
    refused(tmp_path, g, "general.name.type", "unknown value type")


def test_bool_not_0_or_1(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["flag"] = kv_raw("general.flag", BOOL, b"\x02")
    refused(tmp_path, g, "general.flag", "bool")


def test_key_with_newline_stays_one_line(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["nl"] = kv_raw("general.\nx", 13, b"")
    err = refused(tmp_path, g, "general.\\nx.type")
    assert "\n" not in str(err)


# G6: alignment --------------------------------------------------------------------------

@pytest.mark.parametrize("entry, match", [
    (kv("general.alignment", U32, 0), "power of two"),
    (kv("general.alignment", U32, 3), "power of two"),
    (kv("general.alignment", U32, 2**31), "power of two"),
    (kv("general.alignment", U32, 2**21), "power of two"),
    (kv("general.alignment", I32, 32), "UINT32, not INT32"),
    (kv("general.alignment", U64, 32), "UINT32, not UINT64"),
    (kv("general.alignment", STR, "32"), "UINT32, not STRING"),
])
def test_bad_alignment(tmp_path: Path, entry: bytes, match: str) -> None:
    g = tiny_model()
    g.kvs["general.alignment"] = entry
    refused(tmp_path, g, "general.alignment", match)


def test_alignment_64_is_honoured(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["general.alignment"] = kv("general.alignment", U32, 64)
    g.alignment = 64
    g.tensors["output_norm.weight"] = tensor_info("output_norm.weight", (8,), GGML_F32, 2048)
    g.tensors["extra"] = tensor_info("extra", (8,), GGML_F32, 2048 + 64)
    g.data = g.data[:2048] + b"\x00" * 96
    with read_gguf(g.write(tmp_path / "a64.gguf")) as f:
        assert f.alignment == 64 and f.data_offset % 64 == 0
        assert f.tensors["extra"].offset == f.data_offset + 2048 + 64


# G7: tensor shapes and types ------------------------------------------------------------

def _with_tensor(info: bytes, data: bytes = b"") -> RawGGUF:
    g = tiny_model()
    g.tensors["extra"] = info
    g.data += data
    return g


_END = 2048 + 256  # aligned end of tiny_model's tensors, relative to the data section


@pytest.mark.parametrize("n_dims", [0, 5])
def test_n_dims_out_of_range(tmp_path: Path, n_dims: int) -> None:
    info = tensor_info("x", (1,) * n_dims, GGML_F32, _END)
    refused(tmp_path, _with_tensor(info, b"\x00" * 32), "tensor 'x'.n_dims")


@pytest.mark.parametrize("dim", [2**64 - 1, 2**63])
def test_negative_dim(tmp_path: Path, dim: int) -> None:
    info = tensor_info("x", (8, dim), GGML_F32, _END)
    refused(tmp_path, _with_tensor(info), "tensor 'x'.shape[1]", "negative")


def test_element_count_overflows_int64(tmp_path: Path) -> None:
    info = tensor_info("x", (2**63 - 1, 2), 24, _END)  # I8: INT64_MAX x 2
    refused(tmp_path, _with_tensor(info), "tensor 'x'.shape", "2\\^63")


def test_byte_size_larger_than_file(tmp_path: Path) -> None:
    info = tensor_info("x", (4096, 2**42), GGML_F32, _END)  # 2^42 rows x 16 KiB
    refused(tmp_path, _with_tensor(info), "tensor 'x'.shape", "more than the whole file")


def test_row_not_block_multiple(tmp_path: Path) -> None:
    info = tensor_info("x", (33, 2), GGML_Q4_0, _END)
    refused(tmp_path, _with_tensor(info, b"\x00" * 64), "tensor 'x'.shape[0]", "block size 32")


@pytest.mark.parametrize("ggml_type", [4, 5, 31, 1000, 2**32 - 1])
def test_unknown_ggml_type(tmp_path: Path, ggml_type: int) -> None:
    info = tensor_info("x", (32,), ggml_type, _END)
    refused(tmp_path, _with_tensor(info, b"\x00" * 128), "tensor 'x'.type", "unknown ggml type")


@pytest.mark.parametrize("shape", [(64, 0), (0,), (0, 2**62)])
def test_zero_dim_is_an_empty_tensor(tmp_path: Path, shape: tuple[int, ...]) -> None:
    g = _with_tensor(tensor_info("empty", shape, GGML_F32, _END))
    with read_gguf(g.write(tmp_path / "empty.gguf")) as f:
        t = f.tensors["empty"]
        assert (t.n_elements, t.n_bytes, t.shape) == (0, 0, shape)
        assert f.tensor_data("empty").size == 0


# G8: offsets and names ------------------------------------------------------------------

@pytest.mark.parametrize("offset", [0, 2048 + 32, 2048 - 32, 2**64 - 1])
def test_offset_not_running_sum(tmp_path: Path, offset: int) -> None:
    g = tiny_model()
    g.tensors["output_norm.weight"] = tensor_info("output_norm.weight", (64,), GGML_F32, offset)
    refused(tmp_path, g, "tensor 'output_norm.weight'.offset", "aligned end")


def test_tensor_past_eof(tmp_path: Path) -> None:
    g = tiny_model()
    g.data = g.data[:-1]
    refused(tmp_path, g, "tensor 'output_norm.weight'.data", "past the end")


def test_duplicate_tensor_name(tmp_path: Path) -> None:
    info = tensor_info("output_norm.weight", (64,), GGML_F32, _END)
    g = _with_tensor(info, b"\x00" * 256)
    refused(tmp_path, g, "tensor 'output_norm.weight'.name", "duplicate")


def test_tensor_name_lengths(tmp_path: Path) -> None:
    ok = _with_tensor(tensor_info("n" * 63, (8,), GGML_F32, _END), b"\x00" * 32)
    with read_gguf(ok.write(tmp_path / "ok.gguf")) as f:
        assert "n" * 63 in f.tensors
    bad = _with_tensor(tensor_info("n" * 64, (8,), GGML_F32, _END), b"\x00" * 32)
    refused(tmp_path, bad, "tensor[2].name", "cap of 63")
    empty = _with_tensor(tensor_info("", (8,), GGML_F32, _END), b"\x00" * 32)
    refused(tmp_path, empty, "tensor[2].name", "empty")


# G9: truncation -------------------------------------------------------------------------

def test_tiny_cut_at_every_offset(tmp_path: Path) -> None:
    data = tiny_model().build()
    path = tmp_path / "cut.gguf"
    for n in range(len(data)):
        path.unlink(missing_ok=True)  # truncating a just-mapped file is slow here
        path.write_bytes(data[:n])
        with pytest.raises(GGUFFormatError):
            load(path)
    path.write_bytes(data)
    load(path)


@pytest.mark.model  # reads the bundled model file
def test_bundled_cut_at_50_offsets(tmp_path: Path) -> None:
    bundled = bundled_path()
    size = bundled.stat().st_size
    with read_gguf(bundled) as f:
        data_offset = f.data_offset
    with open(bundled, "rb") as src:
        header = src.read(data_offset + 4096)
    cuts = [0, 3, 4, 7, 8, 15, 16, 23, 24, 25, 100, 1000]
    cuts += [data_offset * k // 24 for k in range(1, 24)]
    cuts += [data_offset - 1, data_offset, data_offset + 1]
    cuts += [data_offset + (size - data_offset) * k // 12 for k in range(1, 12)] + [size - 1]
    path = tmp_path / "cut.gguf"
    for n in cuts:
        path.unlink(missing_ok=True)
        with open(path, "wb") as out:  # real header, sparse zeros where the data was
            out.write(header[:n])
            out.truncate(n)
        with pytest.raises(GGUFFormatError):
            load(path)


# G11: bounded mutation fuzz -------------------------------------------------------------

_EXTREMES = [0, 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1]


def test_mutation_fuzz(tmp_path: Path) -> None:
    seed = tiny_model().build()
    rng = random.Random(20240229)
    path = tmp_path / "fuzz.gguf"
    start = time.perf_counter()
    outcomes = {"ok": 0, "refused": 0}
    for case in range(500):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            if rng.random() < 0.3 and pos + 8 <= len(data):
                data[pos : pos + 8] = struct.pack("<Q", rng.choice(_EXTREMES))
            else:
                data[pos] = rng.randrange(256)
        if rng.random() < 0.1:
            del data[rng.randrange(len(data)) :]
        path.unlink(missing_ok=True)
        path.write_bytes(bytes(data))
        try:
            load(path)
            outcomes["ok"] += 1
        except GGUFFormatError:
            outcomes["refused"] += 1
        except Exception as e:  # pragma: no cover - a failure: keep the case reproducible
            hexed = bytes(data).hex()
            raise AssertionError(f"case {case}: {type(e).__name__}: {e}; bytes={hexed}") from e
    assert outcomes["refused"] > 100 and outcomes["ok"] > 10
    assert time.perf_counter() - start < 10


# G12: big headers stay fast -------------------------------------------------------------

def test_160k_vocab_and_1000_tensors_parse_fast(tmp_path: Path) -> None:
    g = tiny_model()
    tokens = [f"tok{i}" for i in range(160_000)]
    g.kvs["tokenizer.ggml.tokens"] = kv_array("tokenizer.ggml.tokens", STR, tokens)
    g.kvs["tokenizer.ggml.scores"] = kv_array("tokenizer.ggml.scores", F32, [0.0] * 160_000)
    g.kvs["tokenizer.ggml.token_type"] = kv_array("tokenizer.ggml.token_type", I32, [1] * 160_000)
    g.kvs["tokenizer.ggml.merges"] = kv_array("tokenizer.ggml.merges", STR, ["t o"] * 160_000)
    g.tensors = {"token_embd.weight": tensor_info("token_embd.weight", (0, 160_000), GGML_F32, 0)}
    for i in range(1000):
        g.tensors[f"blk.{i}.w"] = tensor_info(f"blk.{i}.w", (8,), GGML_F32, 32 * i)
    g.data = b"\x00" * 32 * 1000
    path = g.write(tmp_path / "big.gguf")
    start = time.perf_counter()
    load(path)
    assert time.perf_counter() - start < 2.0


def test_bundled_parses_fast() -> None:
    bundled = bundled_path()
    start = time.perf_counter()
    load(bundled)
    assert time.perf_counter() - start < 1.0


# Valid round trips ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def stock_reader() -> gguf.GGUFReader:
    return gguf.GGUFReader(bundled_path())  # ~4 s: it builds one numpy view per token


@pytest.mark.model  # reads the bundled model file
def test_bundled_matches_gguf_py(stock_reader: gguf.GGUFReader) -> None:
    with read_gguf(bundled_path()) as f:
        assert [t.name for t in stock_reader.tensors] == list(f.tensors)
        for t in stock_reader.tensors:
            mine = f.tensors[t.name]
            assert mine.shape == tuple(int(d) for d in t.shape)
            assert (mine.ggml_type, mine.type_name) == (t.tensor_type, t.tensor_type.name)
            assert (mine.offset, mine.n_bytes) == (t.data_offset, t.n_bytes)
            assert mine.n_elements == t.n_elements
        fields = {k: v for k, v in stock_reader.fields.items() if not k.startswith("GGUF.")}
        assert list(fields) == list(f.metadata)
        for key, field in fields.items():
            mine = f.metadata[key]
            mine = mine.tolist() if isinstance(mine, np.ndarray) else mine
            assert mine == field.contents(), key
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152
        assert "im_start" in f.metadata["tokenizer.chat_template"]
        stock = next(t for t in stock_reader.tensors if t.name == "blk.0.attn_q.weight")
        mine = f.tensor_data("blk.0.attn_q.weight")
        assert np.array_equal(mine, stock.data.reshape(-1).view(np.uint8))


def test_every_value_type_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "all.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    scalars = {
        "u8": (w.add_uint8, 200), "i8": (w.add_int8, -5), "u16": (w.add_uint16, 60000),
        "i16": (w.add_int16, -300), "u32": (w.add_uint32, 2**32 - 1), "i32": (w.add_int32, -7),
        "f32": (w.add_float32, 1.5), "b": (w.add_bool, True), "s": (w.add_string, "héllo"),
        "u64": (w.add_uint64, 2**64 - 1), "i64": (w.add_int64, -(2**63)),
        "f64": (w.add_float64, 0.1),
    }
    for key, (add, v) in scalars.items():
        add(f"t.{key}", v)
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.strs", ["x", "", "zz"])
    arrays = {
        "f16": np.arange(6, dtype=np.float16).reshape(2, 3),
        "i8": np.arange(64, dtype=np.int8),
        "f32": np.ones((3, 2, 2, 2), dtype=np.float32),
    }
    for name, arr in arrays.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with read_gguf(path) as f:
        md = f.metadata
        for key, (_, v) in scalars.items():
            assert md[f"t.{key}"] == pytest.approx(v), key
        assert md["t.ints"].tolist() == [1, 2, 3] and md["t.strs"] == ["x", "", "zz"]
        for name, arr in arrays.items():
            assert f.tensors[name].shape == tuple(reversed(arr.shape))
            assert f.tensor_data(name).tobytes() == arr.tobytes()
