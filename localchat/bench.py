"""`localchat bench`: prefill and decode speed of a model in an engine, measured the
way llama-bench does it (fixed prompt length, fixed generation length, repeats,
mean ± standard deviation), through the same engine interface the app uses.

Each repeat uses a fresh prompt (its first token differs), so no prefix is reused and
prefill really processes every prompt token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from localchat.engine.base import Request, SamplingParams
from localchat.errors import UsageError
from localchat.settings import ChatSettings
from localchat.units import human_bytes

BENCH_TEXT = (
    "The history of computing is a story of machines that remember. Early calculators "
    "kept a handful of digits in gears; later machines kept programs in delay lines, "
    "drums and magnetic cores. Each step made memory larger, faster and cheaper. "
)


def _prompt_tokens(engine, n: int, variant: int) -> list[int]:
    tokens = engine.tokenize_text(f"{variant}: " + BENCH_TEXT * (n // 30 + 2))
    return tokens[:n]


def _summary(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def run_bench(engine, prompt_len: int, gen_len: int, repeats: int) -> dict:
    runs = []
    greedy = SamplingParams(temperature=0.0)
    engine.complete(Request(prompt_tokens=_prompt_tokens(engine, 16, -1), sampling=greedy,
                            max_tokens=4))  # warm-up: first-call allocations
    for i in range(repeats):
        prompt = _prompt_tokens(engine, prompt_len, i)
        result = engine.complete(Request(prompt_tokens=prompt, sampling=greedy,
                                         max_tokens=gen_len))
        runs.append(result.stats)
    return {
        "model": engine.info.name,
        "quant": engine.info.quant_type,
        "engine": engine.name,
        "prompt_tokens": prompt_len,
        "gen_tokens": [s.completion_tokens for s in runs],
        "repeats": repeats,
        "ttft_s": _summary([s.ttft_s for s in runs]),
        "prefill_tok_s": _summary([s.prefill_tok_s for s in runs]),
        "decode_tok_s": _summary([s.decode_tok_s for s in runs]),
        "cached_tokens": [s.cached_tokens for s in runs],
        "kv_cache_bytes": runs[-1].kv_cache_bytes,
        "kv_cache_capacity_bytes": runs[-1].kv_cache_capacity_bytes,
    }


def cmd_bench(args: argparse.Namespace) -> int:
    if min(args.prompt_tokens, args.gen_tokens, args.repeats) < 1:
        raise UsageError("prompt tokens, gen tokens and repeats must each be >= 1")
    settings = ChatSettings(model=args.model, engine=args.engine, ctx_size=args.ctx_size,
                            threads=args.threads)
    engine = settings.load_engine()
    try:
        report = run_bench(engine, args.prompt_tokens, args.gen_tokens, args.repeats)
    finally:
        engine.close()
    if args.json:
        print(json.dumps(report))
        return 0
    row = "{:<14} {:>8} {:>22}"
    print(f"{report['model']} ({report['quant']}) on {report['engine']}, "
          f"{report['repeats']} repeats", file=sys.stderr)
    print(row.format("test", "tokens", "result"))
    for name, key, unit, scale, tokens in [
        (f"pp{args.prompt_tokens}", "prefill_tok_s", "tok/s", 1, args.prompt_tokens),
        (f"tg{args.gen_tokens}", "decode_tok_s", "tok/s", 1, args.gen_tokens),
        ("ttft", "ttft_s", "ms", 1000, args.prompt_tokens),
    ]:
        m, s = report[key]["mean"] * scale, report[key]["std"] * scale
        print(row.format(name, tokens, f"{m:.1f} ± {s:.1f} {unit}"))
    print(f"KV cache after the run: {human_bytes(report['kv_cache_bytes'])} of "
          f"{human_bytes(report['kv_cache_capacity_bytes'])}")
    return 0
