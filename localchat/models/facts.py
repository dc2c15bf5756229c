"""The context a model loads with: -c N as given, -c 0 the model's trained context,
no -c min(trained, DEFAULT_CTX) (Ollama's default). Imports nothing from localchat."""

from __future__ import annotations

DEFAULT_CTX = 4096  # no -c: at most this (also a remote server's when it does not say)
MIN_CTX = 16  # the smallest context load_engine() accepts


def load_context(ctx_size: int | None, context_length: int) -> int:
    """The context a model trained on context_length tokens loads with for --ctx-size."""
    if ctx_size is None:
        return min(context_length, DEFAULT_CTX)
    return context_length if ctx_size == 0 else ctx_size
