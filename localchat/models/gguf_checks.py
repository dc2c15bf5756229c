"""Check the model metadata that engines use as sizes, before any loop or index uses it; the
checks are arch-generic (keys are looked up under general.architecture, ARCH)."""

from __future__ import annotations

from typing import Any

import math

import numpy as np

from localchat.models.gguf_reader import GGUFFile, GGUFFormatError

MAX_LAYERS = 512
MAX_HEADS = 1024
MAX_EMBEDDING = 1 << 20
MAX_HEAD_DIM = 1 << 16
MAX_CONTEXT = 1 << 24
_LEAD = "has unusable model metadata"
# llama.cpp's tokenizer types (llama-vocab.cpp); any other name is refused there, mid-load
TOKENIZER_MODELS = frozenset({"no_vocab", "none", "llama", "bert", "gpt2", "t5", "rwkv", "plamo2"})
# Float hyperparameters with a range beyond finiteness: (key under ARCH., low, high)
_FLOAT_RANGES = (("attention.layer_norm_rms_epsilon", 0.0, 1.0),
                 ("attention.layer_norm_epsilon", 0.0, 1.0),
                 ("rope.freq_base", 1e-6, 1e12),
                 ("rope.scaling.factor", 0.0, 1e6))


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
    _check_floats(f, arch)
    _check_vocab(f, arch)


def _check_floats(f: GGUFFile, arch: str) -> None:
    """Every float under ARCH. finite (a NaN epsilon makes ggml abort), and the ones with a
    meaning-bound range inside it."""
    for key, value in f.metadata.items():
        if not key.startswith(f"{arch}."):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise _fail(f, key, f"{value} is not a finite number")
        if (isinstance(value, np.ndarray) and value.dtype.kind == "f"
                and not np.isfinite(value).all()):
            raise _fail(f, key, "holds a value that is not a finite number")
    for name, lo, hi in _FLOAT_RANGES:
        value = f.metadata.get(f"{arch}.{name}")
        if value is None:
            continue
        if type(value) not in (float, int):
            raise _fail(f, f"{arch}.{name}", f"must be a number, not {type(value).__name__}")
        if not lo <= value <= hi:
            raise _fail(f, f"{arch}.{name}", f"{value} is outside {lo:g}..{hi:g}")


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
    if tokens is not None:
        _check_unique(f, tokens)
    model = f.metadata.get("tokenizer.ggml.model")
    if model is not None and model not in TOKENIZER_MODELS:
        raise _fail(f, "tokenizer.ggml.model",
                    f"{_shown(model)} is not a tokenizer llama.cpp knows "
                    f"({', '.join(sorted(TOKENIZER_MODELS))})")
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


def _check_unique(f: GGUFFile, tokens: list) -> None:
    """No token text twice: llama.cpp maps text -> id and aborts (SIGABRT) on a collision.
    Empty tokens count as llama.cpp renames them, [EMPTY_i]."""
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        text = token if token else f"[EMPTY_{i}]"
        first = seen.setdefault(text, i)
        if first != i:
            raise _fail(f, "tokenizer.ggml.tokens",
                        f"token {_shown(text)} appears twice (ids {first} and {i})")


def _shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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


def check_layer_shapes(f: GGUFFile) -> None:
    """A llama-layout model's tensors (llama, qwen2) against its metadata, as llama.cpp's loader
    checks them: every layer's tensors present with the shapes the sizes imply, none past
    block_count. Raise GGUFFormatError naming the first tensor that disagrees. Shapes are in
    ggml's order (the fastest dimension first)."""
    md = f.metadata
    arch = md["general.architecture"]
    n_layers = _int(f, f"{arch}.block_count", 1, MAX_LAYERS)
    n_embd = _int(f, f"{arch}.embedding_length", 1, MAX_EMBEDDING)
    n_ff = _int(f, f"{arch}.feed_forward_length", 1, MAX_EMBEDDING * 8)
    n_head = _int(f, f"{arch}.attention.head_count", 1, MAX_HEADS)
    n_kv = _int(f, f"{arch}.attention.head_count_kv", 1, MAX_HEADS, default=n_head)
    k_dim = _int(f, f"{arch}.attention.key_length", 1, MAX_HEAD_DIM, default=n_embd // n_head)
    v_dim = _int(f, f"{arch}.attention.value_length", 1, MAX_HEAD_DIM, default=k_dim)
    if f"{arch}.attention.layer_norm_rms_epsilon" not in md:
        raise _fail(f, f"{arch}.attention.layer_norm_rms_epsilon", "missing")
    tokens = md.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, list) else None
    sizes = (f"{arch}.embedding_length={n_embd}, feed_forward_length={n_ff}, "
             f"head_count={n_head}, head_count_kv={n_kv}")
    want: dict[str, tuple[tuple[int | None, ...], bool]] = {
        "token_embd.weight": ((n_embd, n_vocab), True),
        "output_norm.weight": ((n_embd,), True),
        "output.weight": ((n_embd, n_vocab), False),
    }
    for i in range(n_layers):
        p = f"blk.{i}."
        want.update({
            p + "attn_norm.weight": ((n_embd,), True),
            p + "attn_q.weight": ((n_embd, n_head * k_dim), True),
            p + "attn_k.weight": ((n_embd, n_kv * k_dim), True),
            p + "attn_v.weight": ((n_embd, n_kv * v_dim), True),
            p + "attn_output.weight": ((n_head * v_dim, n_embd), True),
            p + "ffn_norm.weight": ((n_embd,), True),
            p + "ffn_gate.weight": ((n_embd, n_ff), True),
            p + "ffn_up.weight": ((n_embd, n_ff), True),
            p + "ffn_down.weight": ((n_ff, n_embd), True),
            p + "attn_q.bias": ((n_head * k_dim,), False),
            p + "attn_k.bias": ((n_kv * k_dim,), False),
            p + "attn_v.bias": ((n_kv * v_dim,), False),
        })
    for name, (shape, required) in want.items():
        t = f.tensors.get(name)
        if t is None:
            if required:
                raise _fail(f, name, f"is missing ({arch}.block_count={n_layers})")
            continue
        have = tuple(int(d) for d in t.shape)
        if len(have) != len(shape) or any(w is not None and w != h for w, h in zip(shape, have)):
            shown = [d if d is not None else "n_vocab" for d in shape]
            raise _fail(f, name, f"has shape {list(have)}, the metadata implies {shown} ({sizes})")
    for name in f.tensors:
        if name.startswith("blk.") and name not in want:
            layer = name.split(".")[1]
            if not layer.isdigit() or int(layer) >= n_layers:
                raise _fail(f, f"{arch}.block_count",
                            f"{n_layers}, but the file holds tensor {_shown(name)}")
