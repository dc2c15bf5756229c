"""localchat: a local terminal chat app with an in-process, quantized LLM runtime."""

import os

# numpy's OpenBLAS starts a worker per core at import that spins for a while; nothing here
# calls BLAS through numpy (llama.cpp and torch keep their own threads), and on 2 cores that
# spin took the one-shot start's median from 0.74 to 0.84 s. A user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
