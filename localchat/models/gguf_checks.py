"""Check the model metadata that engines use as sizes, before any loop or index uses it; the
checks are arch-generic (keys are looked up under general.architecture, ARCH)."""

from __future__ import annotations

from typing import Any

import numpy as np

from localchat.models.gguf_reader import GGUFFile, GGUFFormatError

MAX_LAYERS = 512
MAX_HEADS = 1024
MAX_EMBEDDING = 1 << 20
MAX_HEAD_DIM = 1 << 16
MAX_CONTEXT = 1 << 24
_LEAD = "has unusable model metadata"


def check_model_metadata(f: GGUFFile) -> None:
    """Raise GGUFFormatError naming the first metadata key an engine could not trust."""
    arch = f.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _fail(f, "general.architecture", "missing or not a non-empty string")
    n_layers = _int(f, f"{arch}.block_count", 1, MAX_LAYERS)
    n_embd = _int(f, f"{arch}.embedding_length", 1, MAX_EMBEDDING)
    _int(f, f"{arch}.context_length", 1, MAX_CONTEXT)
    if any(k.startswith((f"{arch}.ssm.", f"{arch}.wkv.")) for k in f.metadata):
        pass  # state-space / RWKV models: llama.cpp runs them; head counts may be 0
    elif isinstance(f.metadata.get(f"{arch}.attention.head_count"), np.ndarray):
        _per_layer(f, f"{arch}.attention.head_count", n_layers)  # e.g. OpenELM
        _per_layer(f, f"{arch}.attention.head_count_kv", n_layers)
    else:
        _check_heads(f, arch, n_embd)
    for key in (f"{arch}.attention.key_length", f"{arch}.attention.value_length"):
        if key in f.metadata:
            _int(f, key, 1, MAX_HEAD_DIM)
    _check_vocab(f, arch)


def _check_heads(f: GGUFFile, arch: str, n_embd: int) -> None:
    n_heads = _int(f, f"{arch}.attention.head_count", 1, MAX_HEADS)
    n_kv_heads = _int(f, f"{arch}.attention.head_count_kv", 1, MAX_HEADS, default=n_heads)
    if n_heads % n_kv_heads:
        raise _fail(f, f"{arch}.attention.head_count_kv",
                    f"{n_kv_heads} does not divide head_count {n_heads}")
    if n_embd % n_heads and f"{arch}.attention.key_length" not in f.metadata:
        raise _fail(f, f"{arch}.embedding_length",
                    f"{n_embd} is not divisible by head_count {n_heads}")


def _per_layer(f: GGUFFile, key: str, n_layers: int) -> None:
    """Per-layer counts: one entry per layer, each 0..MAX_HEADS (0 = no attention there)."""
    value = f.metadata.get(key)
    if value is None:
        return
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
        raise _fail(f, key, "must be an integer or an array of integers")
    if len(value) != n_layers or value.min(initial=0) < 0 or value.max(initial=0) > MAX_HEADS:
        raise _fail(f, key, f"needs {n_layers} entries in 0..{MAX_HEADS}")


def _check_vocab(f: GGUFFile, arch: str) -> None:
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and (not isinstance(tokens, list) or not tokens):
        raise _fail(f, "tokenizer.ggml.tokens", "must be a non-empty array of strings")
    n_tokens = len(tokens) if tokens is not None else None
    embd = f.tensors.get("token_embd.weight")
    rows = embd.shape[1] if embd is not None and len(embd.shape) >= 2 else None
    if embd is not None and rows is None:
        raise _fail(f, "token_embd.weight", f"shape {embd.shape} has no vocabulary rows")
    if n_tokens is not None and rows is not None and rows != n_tokens:
        raise _fail(f, "tokenizer.ggml.tokens",
                    f"{n_tokens} tokens but token_embd.weight has {rows} rows")
    merges = f.metadata.get("tokenizer.ggml.merges")
    if merges is not None and not isinstance(merges, list):
        raise _fail(f, "tokenizer.ggml.merges", "must be an array of strings")
    _check_array(f, "tokenizer.ggml.scores", np.float32, n_tokens)
    _check_array(f, "tokenizer.ggml.token_type", np.int32, n_tokens)
    vocab_key = f"{arch}.vocab_size"
    if vocab_key in f.metadata:
        vocab = _int(f, vocab_key, 1, 2**31 - 1)
        expected = n_tokens if n_tokens is not None else rows
        if expected is not None and vocab != expected:
            what = "tokens in tokenizer.ggml.tokens" if n_tokens is not None else "embedding rows"
            raise _fail(f, vocab_key, f"{vocab} but there are {expected} {what}")


def _check_array(f: GGUFFile, key: str, dtype: type, length: int | None) -> None:
    value = f.metadata.get(key)
    if value is None:
        return
    if not isinstance(value, np.ndarray) or value.dtype != np.dtype(dtype):
        stored = value.dtype.name if isinstance(value, np.ndarray) else type(value).__name__
        raise _fail(f, key, f"must be an array of {np.dtype(dtype).name}, not {stored}")
    if length is not None and len(value) != length:
        raise _fail(f, key, f"has {len(value)} entries for {length} tokens")


def _int(f: GGUFFile, key: str, lo: int, hi: int, default: int | None = None) -> int:
    value: Any = f.metadata.get(key, default)
    if value is None:
        raise _fail(f, key, "missing")
    if type(value) is not int:  # bool, float, str and arrays are all refused
        raise _fail(f, key, f"must be an integer, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise _fail(f, key, f"{value} is outside {lo}..{hi}")
    return value


def _fail(f: GGUFFile, key: str, problem: str) -> GGUFFormatError:
    return GGUFFormatError(f.path, key, problem, lead=_LEAD)
