"""`localchat bench --draft-model SPEC` (or `--draft ngram`): decode speed with and
without the draft, side by side in one run, on the same prompts at temperature 0, with
α, c and γ as the engine measured them and whether the outputs were identical (they
must be: greedy speculative decoding changes the speed, never the text).
"""

from __future__ import annotations

import statistics
import sys

from localchat.engine.base import Message, Request, SamplingParams
from localchat.settings import ChatSettings

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash table works, step by step, with an example in Python.",
    "Describe the water cycle to a ten-year-old.",
)
GREEDY = SamplingParams(temperature=0.0)


def _decode_runs(engine, gen_tokens: int) -> tuple[list[float], list[tuple[int, ...]], list[dict]]:
    rates, outputs, drafts = [], [], []
    engine.complete(Request(messages=[Message("user", "Hi")], sampling=GREEDY, max_tokens=4))
    for prompt in PROMPTS:
        tokens: list[int] = []
        result = None
        for event in engine.generate(Request(messages=[Message("user", prompt)], sampling=GREEDY,
                                             max_tokens=gen_tokens)):
            tokens += getattr(event, "token_ids", ())
            result = event
        rates.append(result.stats.decode_tok_s)
        outputs.append(tuple(tokens))
        drafts.append(result.stats.draft or {})
    return rates, outputs, drafts


def bench_speculative(settings: ChatSettings, gen_tokens: int) -> dict:
    """Two loads of the same target (plain, then with the draft); the same prompts."""
    plain = settings.with_draft(None, None).load_engine()
    try:
        print("benchmarking without the draft…", file=sys.stderr)
        base_rates, base_out, _ = _decode_runs(plain, gen_tokens)
    finally:
        plain.close()
    drafted = settings.load_engine()
    try:
        print(f"benchmarking with draft {settings.draft}…", file=sys.stderr)
        rates, out, drafts = _decode_runs(drafted, gen_tokens)
    finally:
        drafted.close()
    proposed = sum(d.get("proposed", 0) for d in drafts)
    accepted = sum(d.get("accepted", 0) for d in drafts)
    no_draft, with_draft = statistics.median(base_rates), statistics.median(rates)
    last = drafts[-1]
    return {
        "draft": settings.draft, "engine": settings.engine, "gen_tokens": gen_tokens,
        "prompts": len(PROMPTS),
        "no_draft_tok_s": no_draft, "draft_tok_s": with_draft,
        "speedup": with_draft / no_draft if no_draft else 0.0,
        "alpha": accepted / proposed if proposed else 0.0,
        "c": last.get("c"), "gamma": last.get("gamma"),
        "predicted_speedup": last.get("predicted_speedup"),
        "tokens_per_target_pass": statistics.mean(d.get("tokens_per_target_pass", 1.0) for d in drafts),
        "identical_output": base_out == out,
        "per_prompt": {"no_draft_tok_s": base_rates, "draft_tok_s": rates,
                       "draft_stats": drafts},
    }


def format_speculative(s: dict) -> str:
    c = "n/a" if s["c"] is None else f"{s['c']:.2f}"
    return "\n".join([
        f"speculative decoding, draft {s['draft']} ({s['engine']} engine), temperature 0, "
        f"median of {s['prompts']} prompts × {s['gen_tokens']} tokens",
        f"  decode without draft   {s['no_draft_tok_s']:8.1f} tok/s",
        f"  decode with draft      {s['draft_tok_s']:8.1f} tok/s   ({s['speedup']:.2f}x)",
        f"  α (accepted/proposed)  {s['alpha']:8.2f}",
        f"  c (draft/target step)  {c:>8s}",
        f"  γ (last chosen)        {s['gamma']!s:>8s}   predicted {s['predicted_speedup'] or 0:.2f}x",
        f"  tokens per target pass {s['tokens_per_target_pass']:8.2f}",
        f"  identical output       {'yes' if s['identical_output'] else 'NO'}",
    ])
