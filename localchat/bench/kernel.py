"""`localchat bench`'s kernel-limit row: a bare llama_decode greedy loop (no runtime) on a
context configured as the llama.cpp executor's; our runtime's own cost is the gap to it."""

from __future__ import annotations

import time

import numpy as np

from localchat.engine.executors.llamacpp import LlamaCppExecutor
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.models.facts import GGUFFacts
from localchat.engine.choice import default_threads


def _decode(executor: LlamaCppExecutor, entries: list[tuple[int, int, int, bool]]) -> np.ndarray:
    """entries: (slot, position, token, wants logits); the argmax of each wanted row."""
    return executor.decode_raw(entries).argmax(-1)


def _greedy(executor: LlamaCppExecutor, prompts: list[list[int]], steps: int) -> tuple[float, float]:
    """(decode tok/s, tok/s over prefill and decode together) for len(prompts) sequences."""
    executor.clear()
    start = time.perf_counter()  # every prompt in one batch, then steps of one token each
    first = _decode(executor, [(s, i, t, i == len(p) - 1)
                               for s, p in enumerate(prompts) for i, t in enumerate(p)])
    for s, token in enumerate(first):
        prompts[s].append(int(token))
    t_decode = time.perf_counter()
    for _ in range(steps - 1):
        nxt = _decode(executor, [(s, len(p) - 1, p[-1], True) for s, p in enumerate(prompts)])
        for s, token in enumerate(nxt):
            prompts[s].append(int(token))
    end = time.perf_counter()
    n = len(prompts)
    return n * (steps - 1) / (end - t_decode), n * steps / (end - start)


class BareLoop:
    """A llama.cpp context configured as the llama.cpp executor's, and the rates the bare
    loop measured on it so far."""

    def __init__(self, facts: GGUFFacts, *, n_ctx: int, threads: int | None, slots: int) -> None:
        self.executor = COMPUTE.call(lambda: LlamaCppExecutor(facts, n_ctx=n_ctx, threads=threads or default_threads(),
                                                              parallel=slots))
        self.singles: list[float] = []
        self.batches: list[tuple[int, float, float]] = []  # (sequences, decode, with prefill)
        self.gen_tokens = self.batch_tokens = 0

    def single(self, prompt: list[int], steps: int) -> None:
        self.gen_tokens = steps
        self.singles.append(COMPUTE.call(_greedy, self.executor, [list(prompt)], steps)[0])

    def batch(self, prompts: list[list[int]], steps: int) -> None:
        self.batch_tokens = steps
        decode, total = COMPUTE.call(_greedy, self.executor, [list(p) for p in prompts], steps)
        self.batches.append((len(prompts), decode, total))

    def report(self) -> dict:
        out: dict = {"gen_tokens": self.gen_tokens, "batch_tokens": self.batch_tokens}
        if self.singles:
            out["decode_tok_s"] = float(np.median(self.singles))
        if self.batches:
            n = self.batches[0][0]
            out.update({"sequences": n,
                        f"decode_{n}_tok_s": float(np.median([b[1] for b in self.batches])),
                        f"aggregate_{n}_tok_s": float(np.median([b[2] for b in self.batches]))})
        return out

    def close(self) -> None:
        COMPUTE.call(self.executor.close)
