"""check_model_metadata (reliability case G10): metadata that engines use as sizes is
refused, naming the key, before any loop or index uses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.gguf_builder import (
    F32, I8, I32, STR, TINY_TOKENS, U8, U32, U64, bundled_path, kv, kv_array, load, refused,
    tiny_model,
)

_SCALARS = [
    ("llama.block_count", U32, 10**6),
    ("llama.block_count", U32, 0),
    ("llama.block_count", F32, 2.0),
    ("llama.block_count", STR, "2"),
    ("llama.attention.head_count", U32, 0),
    ("llama.attention.head_count", I32, -4),
    ("llama.attention.head_count", U32, 4096),
    ("llama.attention.head_count_kv", U32, 3),  # does not divide 4 heads
    ("llama.attention.head_count_kv", U32, 0),
    ("llama.embedding_length", U32, 66),  # not divisible by 4 heads
    ("llama.context_length", U32, 0),
    ("llama.context_length", U64, 2**63),
    ("llama.attention.key_length", U32, 0),
    ("llama.vocab_size", U32, 9),
    ("general.architecture", U32, 1),
    ("general.architecture", STR, ""),
]


@pytest.mark.parametrize("key, vtype, value", _SCALARS)
def test_bad_size_metadata(tmp_path: Path, key: str, vtype: int, value: object) -> None:
    g = tiny_model()
    g.kvs[key] = kv(key, vtype, value)
    err = refused(tmp_path, g, key)
    assert "unusable model metadata" in str(err)


_ARRAYS = [
    ("tokenizer.ggml.scores", I8, [0] * 8),  # 1-byte scores once read as floats
    ("tokenizer.ggml.scores", F32, [0.0] * 9),
    ("tokenizer.ggml.token_type", I32, [1] * 7),
    ("tokenizer.ggml.token_type", U8, [1] * 8),
    ("tokenizer.ggml.tokens", U32, [1] * 8),
    ("tokenizer.ggml.tokens", STR, TINY_TOKENS + ["x"]),  # 9 tokens, 8 embedding rows
    ("tokenizer.ggml.tokens", STR, []),
]


@pytest.mark.parametrize("key, itype, values", _ARRAYS)
def test_bad_tokenizer_arrays(tmp_path: Path, key: str, itype: int, values: list) -> None:
    g = tiny_model()
    g.kvs[key] = kv_array(key, itype, values)
    refused(tmp_path, g, key)


def test_scalar_tokens_refused(tmp_path: Path) -> None:
    g = tiny_model()
    g.kvs["tokenizer.ggml.tokens"] = kv("tokenizer.ggml.tokens", STR, "abc")
    refused(tmp_path, g, "tokenizer.ggml.tokens", "array of strings")


def test_missing_block_count(tmp_path: Path) -> None:
    g = tiny_model()
    del g.kvs["llama.block_count"]
    refused(tmp_path, g, "llama.block_count", "missing")


def test_head_count_kv_defaults_to_head_count(tmp_path: Path) -> None:
    g = tiny_model()
    del g.kvs["llama.attention.head_count_kv"]
    load(g.write(tmp_path / "ok.gguf"))


def test_vocab_size_matches_embedding_when_no_tokenizer(tmp_path: Path) -> None:
    g = tiny_model()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        del g.kvs[key]
    g.kvs["llama.vocab_size"] = kv("llama.vocab_size", U32, 8)
    load(g.write(tmp_path / "ok.gguf"))
    g.kvs["llama.vocab_size"] = kv("llama.vocab_size", U32, 7)
    refused(tmp_path, g, "llama.vocab_size", "embedding rows")


def test_bundled_model_passes() -> None:
    load(bundled_path())


def test_state_space_models_may_have_no_attention_heads(tmp_path: Path) -> None:
    """llama.cpp runs Mamba/RWKV GGUFs (head_count 0); the llama.cpp engine must too."""
    g = tiny_model()
    g.kvs["llama.attention.head_count"] = kv("llama.attention.head_count", U32, 0)
    g.kvs["llama.ssm.conv_kernel"] = kv("llama.ssm.conv_kernel", U32, 4)
    load(g.write(tmp_path / "ssm.gguf"))


def test_per_layer_head_counts(tmp_path: Path) -> None:
    """OpenELM-style arrays: one count per layer, checked element by element."""
    g = tiny_model()
    layers = 2  # tiny_model's block_count
    g.kvs["llama.attention.head_count"] = kv_array("llama.attention.head_count", I32, [4] * layers)
    g.kvs["llama.attention.head_count_kv"] = kv_array(
        "llama.attention.head_count_kv", I32, [2] * layers)
    load(g.write(tmp_path / "ok.gguf"))
    g.kvs["llama.attention.head_count"] = kv_array("llama.attention.head_count", I32, [4])
    refused(tmp_path, g, "llama.attention.head_count", "entries")
