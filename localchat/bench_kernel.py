"""`localchat bench`'s kernel-limit row: a bare llama_decode greedy loop, no runtime (no
scheduler, block manager, sampler or streaming), on a llama.cpp context configured as the
llama.cpp executor's, in the same process. Our runtime's own cost is the gap to it.

One sequence: prefill a prompt, then greedy steps of one token (argmax in numpy over
llama.cpp's logits). N sequences: N prompts, then steps of N tokens in one llama_decode.
"""

from __future__ import annotations

import time

import llama_cpp
import numpy as np

from localchat.engine.executors.llamacpp import LlamaCppExecutor
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.model_files import GGUFFacts


def _decode(executor: LlamaCppExecutor, entries: list[tuple[int, int, int, bool]]) -> np.ndarray:
    """entries: (slot, position, token, wants logits); the argmax of each wanted row."""
    b = executor._batch
    for start in range(0, len(entries), len(b.token)):
        part = entries[start:start + len(b.token)]
        n = len(part)
        b.seq_id[:n], b.pos[:n], b.token[:n], b.logits[:n] = zip(*part)
        b.struct.n_tokens = n
        if llama_cpp.llama_decode(executor._ctx.ctx, b.struct) != 0:
            raise RuntimeError("llama_decode failed")
    rows = int(b.logits[:n].sum())
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(executor._ctx.ctx),
                                   shape=(rows, executor.n_vocab))
    return logits.argmax(-1)


def _greedy(executor: LlamaCppExecutor, prompts: list[list[int]], steps: int) -> tuple[float, float]:
    """(decode tok/s, tok/s over prefill and decode together) for len(prompts) sequences."""
    mem = llama_cpp.llama_get_memory(executor._ctx.ctx)
    llama_cpp.llama_memory_clear(mem, True)
    start = time.perf_counter()
    for slot, prompt in enumerate(prompts):
        last = _decode(executor, [(slot, i, t, i == len(prompt) - 1) for i, t in enumerate(prompt)])
        prompts[slot] = prompt + [int(last[0])]
    t_decode = time.perf_counter()
    for _ in range(steps - 1):
        nxt = _decode(executor, [(s, len(p) - 1, p[-1], True) for s, p in enumerate(prompts)])
        for s, token in enumerate(nxt):
            prompts[s].append(int(token))
    end = time.perf_counter()
    n = len(prompts)
    return n * (steps - 1) / (end - t_decode), n * steps / (end - start)


def bench_kernel_limit(facts: GGUFFacts, *, n_ctx: int, threads: int | None,
                       single_prompt: list[int], batch_prompts: list[list[int]], gen_tokens: int,
                       batch_tokens: int, repeats: int) -> dict:
    """The bare loop with one sequence (single_prompt, gen_tokens steps) and with
    len(batch_prompts) sequences (batch_tokens steps each); medians of `repeats`."""
    executor = COMPUTE.call(lambda: LlamaCppExecutor(facts, n_ctx=n_ctx, threads=threads,
                                                     parallel=len(batch_prompts)))
    try:
        one = [COMPUTE.call(_greedy, executor, [list(single_prompt)], gen_tokens)[0]
               for _ in range(repeats)]
        many = [COMPUTE.call(_greedy, executor, [list(p) for p in batch_prompts], batch_tokens)
                for _ in range(max(1, repeats // 2))]
    finally:
        COMPUTE.call(executor.close)
    n = len(batch_prompts)
    return {"decode_tok_s": float(np.median(one)),
            f"decode_{n}_tok_s": float(np.median([m[0] for m in many])),
            f"aggregate_{n}_tok_s": float(np.median([m[1] for m in many])),
            "sequences": n, "gen_tokens": gen_tokens, "batch_tokens": batch_tokens}
