"""localchat: a local terminal chat app with an in-process, quantized LLM runtime."""

__version__ = "0.1.0"
