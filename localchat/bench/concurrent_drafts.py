"""`localchat bench --concurrency N` with a draft (--draft-model or --draft): N concurrent
greedy requests on the engine with the draft against the same N on the engine without it,
alternated (plain, drafted, plain) so that a shared machine's drift cancels, after one unmeasured
pass on each so every measured run finds its prompts cached alike; aggregate tok/s, the
speedup, the drafts' acceptance and whether every reply is identical."""

from __future__ import annotations

import sys
from dataclasses import replace

from localchat.bench.concurrency import GREEDY, chat_requests, complete_concurrently
from localchat.bench.speculative import alpha_of
from localchat.engine import open_engine
from localchat.engine.base import Message, Request
from localchat.engine.config import EngineConfig
from localchat.bench.concurrency import GEN_TOKENS

OFFSET = 500_000  # prompts of their own: no prefix-cache hits from the plain concurrency table


def _level(plain, drafted, n: int) -> dict:
    requests = chat_requests(n, OFFSET + 1000 * n)
    for engine in (plain, drafted):  # prompts cached on both sides (else only the last plain run's)
        complete_concurrently(engine, requests)
    before, base_results = complete_concurrently(plain, requests)
    with_draft, results = complete_concurrently(drafted, requests)
    after = complete_concurrently(plain, requests)[0]
    base = (before["aggregate_tok_s"] + after["aggregate_tok_s"]) / 2
    drafts = [r.stats.draft or {} for r in results]
    proposed = sum(d.get("proposed", 0) for d in drafts)
    passes = [d["tokens_per_target_pass"] for d in drafts if d.get("tokens_per_target_pass")]
    return {
        "no_draft_tok_s": base, "draft_tok_s": with_draft["aggregate_tok_s"],
        "speedup": with_draft["aggregate_tok_s"] / base if base else 0.0,
        "no_draft_runs_tok_s": [before["aggregate_tok_s"], after["aggregate_tok_s"]],
        "draft_p50_latency_s": with_draft["p50_latency_s"],
        "no_draft_p50_latency_s": before["p50_latency_s"],
        "alpha": alpha_of(drafts), "proposed": proposed,
        "tokens_per_target_pass": sum(passes) / len(passes) if passes else 1.0,
        "identical_output": [r.text for r in results] == [r.text for r in base_results],
    }


def bench_concurrent_drafts(config: EngineConfig, levels: list[int]) -> dict:
    """{"N": {...}} per level: the first engine with the draft vs without, N at once."""
    parallel = max(levels)
    plain = open_engine(config.without_draft(parallel=parallel))
    try:
        drafted = open_engine(replace(config, parallel=parallel))
        try:
            warm = Request(messages=[Message("user", "Hi")], sampling=GREEDY, max_tokens=8)
            for engine in (plain, drafted):
                engine.complete(warm)
            table = {}
            for n in levels:
                print(f"concurrency {n} with and without the draft…", file=sys.stderr)
                table[str(n)] = _level(plain, drafted, n)
        finally:
            drafted.close()
    finally:
        plain.close()
    return {"engine": config.engine, "draft": config.draft.record(), "levels": table}


def format_concurrent_drafts(report: dict) -> str:
    lines = [f"concurrent requests with draft {report['draft']} ({report['engine']} engine), "
             f"{GEN_TOKENS} tokens each, temperature 0 (drafted between two plain runs)",
             f"{'N':>4} {'no draft':>9} {'draft':>9} {'speedup':>8} {'α':>5} {'tok/pass':>8}"
             "  identical"]
    for n, row in sorted(report["levels"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"{n:>4} {row['no_draft_tok_s']:9.1f} {row['draft_tok_s']:9.1f} "
                     f"{row['speedup']:7.2f}x {row['alpha']:5.2f} "
                     f"{row['tokens_per_target_pass']:8.2f}  "
                     f"{'yes' if row['identical_output'] else 'NO'}")
    lines.append("  (aggregate tok/s of all N replies, prefill included)")
    return "\n".join(lines)
