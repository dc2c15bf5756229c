"""What `localchat bench --task json` measures: the same prompts decoded free, under a JSON
schema, and under it with the grammar's forced tokens verified as drafts (tok/s, passes,
mask time, forced share, valid n/n, identical greedy output)."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.constraint import Constraint

GREEDY = SamplingParams(temperature=0.0)
_NAME = {"type": "string", "maxLength": 24}
TASKS: list[tuple[str, dict]] = [
    ("Describe a person as JSON.", {
        "type": "object", "properties": {"name": _NAME, "age": {"type": "integer"},
                                         "city": _NAME, "email": _NAME},
        "required": ["name", "age", "city", "email"], "additionalProperties": False}),
    ("List three cities and their countries as JSON.", {
        "type": "object", "properties": {"cities": {"type": "array", "minItems": 3, "maxItems": 3,
                                                    "items": {"type": "object", "properties": {
                                                        "city": _NAME, "country": _NAME},
                                                        "required": ["city", "country"],
                                                        "additionalProperties": False}}},
        "required": ["cities"], "additionalProperties": False}),
    ("Describe a book as JSON.", {
        "type": "object", "properties": {"title": _NAME, "author": _NAME,
                                         "year": {"type": "integer"},
                                         "genre": {"enum": ["fiction", "science", "history"]},
                                         "in_print": {"type": "boolean"}},
        "required": ["title", "author", "year", "genre", "in_print"],
        "additionalProperties": False}),
    ("Describe the weather in two places as JSON.", {
        "type": "object", "properties": {"reports": {"type": "array", "minItems": 2, "maxItems": 2,
                                                     "items": {"type": "object", "properties": {
                                                         "place": _NAME,
                                                         "celsius": {"type": "integer"},
                                                         "sky": {"enum": ["clear", "cloudy",
                                                                          "rain"]}},
                                                         "required": ["place", "celsius", "sky"],
                                                         "additionalProperties": False}}},
        "required": ["reports"], "additionalProperties": False}),
]


def _run(engine, requests: list[Request]) -> tuple[list, float]:
    """The results of requests run at once, and the wall time they took."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(engine.complete, requests))
    return results, time.perf_counter() - t0


def _valid(result) -> bool:
    try:
        json.loads(result.text)
    except ValueError:
        return False
    return result.finish_reason == "stop"


def bench_json(engine, gen_tokens: int, concurrency: int = 1, repeats: int = 1) -> dict:
    """One engine's free vs constrained numbers (greedy), `concurrency` requests at once."""
    stats = engine.step_stats
    tasks = [(Message("user", prompt), schema) for prompt, schema in TASKS]
    rounds = max(repeats, -(-len(tasks) // concurrency))  # every task at least once

    def make(round_: int, constraint: bool) -> list[Request]:
        batch = [tasks[(round_ * concurrency + i) % len(tasks)] for i in range(concurrency)]
        return [Request(messages=[m], sampling=GREEDY, max_tokens=gen_tokens,
                        constraint=Constraint.json_schema(s) if constraint else None)
                for m, s in batch]

    engine.complete(Request(messages=[Message("user", "Hi")], sampling=GREEDY, max_tokens=4))
    out: dict = {"concurrency": concurrency}
    texts = {}
    for mode in ("free", "constrained", "forced_drafts"):
        engine.forced_drafts = mode == "forced_drafts"
        mask0, rows0, kept0, steps0 = (stats.mask_s, stats.masked_rows, stats.forced_kept,
                                       stats.steps)
        rates, tokens, valid, wall, texts[mode] = [], 0, 0, 0.0, []
        for round_ in range(rounds):
            results, seconds = _run(engine, make(round_, mode != "free"))
            wall += seconds
            tokens += sum(r.stats.completion_tokens for r in results)
            rates += [r.stats.decode_tok_s for r in results if r.stats.decode_tok_s]
            valid += sum(_valid(r) for r in results)
            texts[mode] += [r.text for r in results]
        entry = {"decode_tok_s": statistics.median(rates) if rates else 0.0,
                 "total_tok_s": tokens / wall if wall else 0.0, "tokens": tokens,
                 "target_passes": stats.steps - steps0,
                 "valid": f"{valid}/{rounds * concurrency}"}
        if mode != "free":
            rows = stats.masked_rows - rows0
            entry["mask_us_per_token"] = (stats.mask_s - mask0) * 1e6 / rows if rows else 0.0
            entry["forced_share"] = (stats.forced_kept - kept0) / tokens if tokens else 0.0
        out[mode] = entry
    engine.forced_drafts = True
    free, plain, forced = out["free"], out["constrained"], out["forced_drafts"]
    out["speedup_forced_vs_constrained"] = _ratio(forced["total_tok_s"], plain["total_tok_s"])
    out["speedup_constrained_vs_free"] = _ratio(forced["total_tok_s"], free["total_tok_s"])
    # decode only (prefill excluded): constrained replies are shorter, so the prompt's
    # prefill weighs more in their total tok/s
    out["decode_speedup_vs_free"] = _ratio(forced["decode_tok_s"], free["decode_tok_s"])
    # the share of a decode step spent on the mask (one token per step, constrained)
    step_us = 1e6 * concurrency / plain["total_tok_s"] if plain["total_tok_s"] else 0.0
    out["mask_share_of_step"] = _ratio(plain["mask_us_per_token"] * concurrency, step_us)
    out["forced_identical"] = texts["constrained"] == texts["forced_drafts"]
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def format_json_report(name: str, r: dict) -> str:
    lines = [f"{name}, {r['concurrency']} at once:"]
    for mode in ("free", "constrained", "forced_drafts"):
        e = r[mode]
        extra = "" if mode == "free" else (f", mask {e['mask_us_per_token']:.0f} µs/token, "
                                           f"forced {e['forced_share']:.0%}")
        lines.append(f"  {mode:<14} {e['total_tok_s']:7.1f} tok/s ({e['decode_tok_s']:.1f} decode)  "
                     f"{e['tokens']:5d} tokens in "
                     f"{e['target_passes']:4d} passes, valid {e['valid']}{extra}")
    lines.append(f"  forced drafts: {r['speedup_forced_vs_constrained']:.2f}x constrained, "
                 f"{r['speedup_constrained_vs_free']:.2f}x free "
                 f"({r['decode_speedup_vs_free']:.2f}x free decode); mask "
                 f"{r['mask_share_of_step']:.1%} of a step; greedy identical with and "
                 f"without forced drafts: {r['forced_identical']}")
    return "\n".join(lines)
