"""localchat's own runtime (in progress): the torch engine.

Split like nano-vllm: blocks.py (paged KV block pool with prefix caching), model.py
(Llama-family forward over the paged cache), qlinear.py (quantized linear layers),
weights.py (GGUF tensors -> torch). It is not selectable with --engine yet.
"""
