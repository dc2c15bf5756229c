"""`localchat bench --draft-model SPEC` (or `--draft ngram|auto`): decode speed with and without
the draft on the same prompts at temperature 0, with α, c, β and γ as the engine measured them,
and whether the outputs were identical (greedy speculation changes the speed, never the text)."""

from __future__ import annotations

import statistics
import sys

from localchat.engine.base import Message, Request, SamplingParams
from localchat.settings import ChatSettings

PASSAGE = (
    "The river ran quietly past the old mill, where the miller's daughter sat every evening "
    "to watch the light fade over the water. She knew every bend of the river, every stone "
    "that broke its surface, and every bird that nested in the reeds along its banks. When "
    "the floods came in the spring, the river rose above the stones and the birds moved "
    "higher up the bank, but by summer everything returned to its place, as if the river "
    "had only been dreaming.")

TASKS = {
    "chat": (
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain how a hash table works, step by step, with an example in Python.",
        "Describe the water cycle to a ten-year-old.",
    ),
    "quote": (  # replies that copy their prompt: where prompt lookup pays
        "Repeat the following text exactly, fixing only its spelling mistakes:\n\n" + PASSAGE,
        "Rewrite the following text word for word, but change every 'river' to 'stream':\n\n"
        + PASSAGE,
    ),
}
GREEDY = SamplingParams(temperature=0.0)


def _decode_runs(engine, prompts, gen_tokens: int) -> tuple[list[float], list[tuple[int, ...]], list[dict]]:
    rates, outputs, drafts = [], [], []
    engine.complete(Request(messages=[Message("user", "Hi")], sampling=GREEDY, max_tokens=4))
    for prompt in prompts:
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


def _summary(base, drafted) -> dict:
    (base_rates, base_out, _), (rates, out, drafts) = base, drafted
    proposed = sum(d.get("proposed", 0) for d in drafts)
    accepted = sum(d.get("accepted", 0) for d in drafts)
    no_draft, with_draft = statistics.median(base_rates), statistics.median(rates)

    def mean(key):
        values = [d[key] for d in drafts if d.get(key) is not None and d.get("proposed")]
        return statistics.mean(values) if values else None

    return {
        "no_draft_tok_s": no_draft, "draft_tok_s": with_draft,
        "speedup": with_draft / no_draft if no_draft else 0.0,
        "alpha": accepted / proposed if proposed else 0.0,
        "c": mean("c"), "beta": mean("beta"), "gamma": drafts[-1].get("gamma"),
        "predicted_speedup": mean("predicted_speedup"),
        "tokens_per_target_pass": statistics.mean(d.get("tokens_per_target_pass", 1.0) for d in drafts),
        "identical_output": base_out == out, "prompts": len(out),
        "per_prompt": {"no_draft_tok_s": base_rates, "draft_tok_s": rates, "draft_stats": drafts},
    }


def bench_speculative(settings: ChatSettings, gen_tokens: int) -> dict:
    """Two loads of the same target (plain, then with the draft); the same prompts. The
    top-level figures are the chat task's; `tasks` has each task's."""
    runs = {}
    plain = settings.with_draft(None, None).load_engine()
    try:
        print("benchmarking without the draft…", file=sys.stderr)
        runs["plain"] = {task: _decode_runs(plain, prompts, gen_tokens) for task, prompts in TASKS.items()}
    finally:
        plain.close()
    drafted = settings.load_engine()
    try:
        source = getattr(getattr(drafted, "draft", None), "source", settings.draft)
        print(f"benchmarking with draft {source}…", file=sys.stderr)
        runs["draft"] = {task: _decode_runs(drafted, prompts, gen_tokens) for task, prompts in TASKS.items()}
    finally:
        drafted.close()
    tasks = {task: _summary(runs["plain"][task], runs["draft"][task]) for task in TASKS}
    head = {k: v for k, v in tasks["chat"].items() if k != "per_prompt"}
    return {"draft": settings.draft, "source": source, "engine": settings.engine,
            "gen_tokens": gen_tokens, **head, "tasks": tasks}


def format_speculative(s: dict) -> str:
    def num(value, fmt: str = ".2f") -> str:
        return "n/a" if value is None else format(value, fmt)

    lines = [f"speculative decoding, draft {s['source']} ({s['engine']} engine), temperature 0, "
             f"median over prompts × {s['gen_tokens']} tokens",
             f"  {'task':6s} {'no draft':>9s} {'draft':>9s} {'speedup':>8s} {'α':>5s} {'c':>5s} "
             f"{'β':>5s} {'γ':>3s} {'predicted':>9s} {'tok/pass':>8s}  identical"]
    for task, t in s["tasks"].items():
        lines.append(
            f"  {task:6s} {t['no_draft_tok_s']:9.1f} {t['draft_tok_s']:9.1f} {t['speedup']:7.2f}x "
            f"{t['alpha']:5.2f} {num(t['c']):>5s} {num(t['beta']):>5s} {t['gamma']!s:>3s} "
            f"{num(t['predicted_speedup']):>8s}x {t['tokens_per_target_pass']:8.2f}  "
            f"{'yes' if t['identical_output'] else 'NO'}")
    lines.append("  (tok/s: decode rate; α: drafts kept ÷ proposed; c: a draft step ÷ a target "
                 "step; β: a verify pass's extra cost per draft token, in target steps)")
    return "\n".join(lines)
