"""One engine's speed on one model, llama-bench style: prefill, decode, TTFT (turn 1 vs turn
8), weights memory and KV bytes per token; median and spread over repeats, each on a fresh
prompt."""

from __future__ import annotations

import statistics

from localchat.engine.base import Message, Request, SamplingParams

BENCH_TEXT = (
    "The history of computing is a story of machines that remember. Early calculators "
    "kept a handful of digits in gears; later machines kept programs in delay lines, "
    "drums and magnetic cores. Each step made memory larger, faster and cheaper. "
)
CHAT_TURNS = 8
CHAT_REPLY_TOKENS = 32  # at most; fewer when -g asks for fewer
GREEDY = SamplingParams(temperature=0.0)


def _prompt_tokens(engine, n: int, variant: int) -> list[int]:
    return engine.tokenize_text(f"{variant}: " + BENCH_TEXT * (n // 30 + 2))[:n]


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _chat_ttfts(engine, reply_tokens: int) -> tuple[float, float]:
    """TTFT of the first and the eighth turn of one chat (earlier turns stay cached)."""
    history = [Message("system", "You are a helpful assistant.")]
    ttfts = []
    for turn in range(CHAT_TURNS):
        history.append(Message("user", f"Tell me fact number {turn + 1} about the sea."))
        result = engine.complete(Request(messages=history, sampling=GREEDY,
                                         max_tokens=reply_tokens))
        history.append(Message("assistant", result.text))
        ttfts.append(result.stats.ttft_s)
    return ttfts[0], ttfts[-1]


def bench_engine(engine, prompt_len: int, gen_len: int, repeats: int,
                 after_each=None) -> dict:
    """after_each(prompt tokens), if given, runs after every repeat (the kernel limit's
    bare loop, interleaved so both see the same machine: it is shared and noisy)."""
    for warm_up in (16, prompt_len):  # first-call allocations; torch compiles per shape kind
        engine.complete(Request(prompt_tokens=_prompt_tokens(engine, warm_up, -1),
                                sampling=GREEDY, max_tokens=4))
    runs = []
    for i in range(repeats):
        prompt = _prompt_tokens(engine, prompt_len, i)
        runs.append(engine.complete(Request(prompt_tokens=prompt, sampling=GREEDY,
                                            max_tokens=gen_len)).stats)
        if after_each is not None:
            after_each(prompt)
    turn1, turn8 = _chat_ttfts(engine, min(CHAT_REPLY_TOKENS, gen_len))
    prefill = _spread([s.prefill_tok_s for s in runs])
    decode = _spread([s.decode_tok_s for s in runs])
    ttft = _spread([s.ttft_s for s in runs])
    return {
        "prefill_tok_s": prefill["median"], "decode_tok_s": decode["median"],
        "ttft_s": ttft["median"], "ttft_turn1_s": turn1, "ttft_turn8_s": turn8,
        "weights_bytes": engine.info.weights_bytes,
        "kv_bytes_per_token": engine.info.kv_bytes_per_token,
        "kernels": engine.info.kernels,
        "compute": engine.info.compute,
        "spread": {"prefill_tok_s": prefill, "decode_tok_s": decode, "ttft_s": ttft},
        "gen_tokens": [s.completion_tokens for s in runs],
        "cached_tokens": [s.cached_tokens for s in runs],
        "thread_governor": _governor(engine),
    }


def _governor(engine) -> dict | None:
    """Where the runtime chose the thread count (no -t): the count it ended on, its moves."""
    governor = getattr(getattr(engine, "runner", None), "threads", None)
    if governor is None:
        return None
    return {"threads": governor.threads, "switches": governor.switches, "probes": governor.probes,
            "counts_used": sorted(governor.counts_used)}
