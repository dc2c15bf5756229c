"""What is known about a model, whatever its file: GGUFFacts (with the one KV bytes per token
formula) and the one default-context rule: ctx_size N as given, 0 the model's trained context,
None min(trained, DEFAULT_CTX). Imports nothing from localchat, nor gguf or numpy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_CTX = 4096  # no ctx_size: at most this (also a remote server's when it does not say)
MIN_CTX = 16  # the smallest context load_engine() accepts


def load_context(ctx_size: int | None, context_length: int) -> int:
    """The context a model trained on context_length tokens loads with for ctx_size."""
    if ctx_size is None:
        return min(context_length, DEFAULT_CTX)
    return context_length if ctx_size == 0 else ctx_size


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
    chat_markers: tuple[str, ...] = ()  # chat-format control tokens in the vocabulary
    chat_template_name: str = "the model file's"  # where chat_template came from
    base_model: bool = False  # the file has no chat template and no chat tokens (set with one)

    def kv_bytes_per_token(self, bytes_per_value: float = 2,
                           v_bytes_per_value: float | None = None) -> int:
        """KV-cache bytes one token costs: K and V, for every layer and KV head, at
        bytes_per_value (V at v_bytes_per_value when given), rounded to whole bytes."""
        values = self.n_layers * self.n_kv_heads * self.head_dim  # per token, K and V each
        v_bytes = bytes_per_value if v_bytes_per_value is None else v_bytes_per_value
        return round(values * (bytes_per_value + v_bytes))
