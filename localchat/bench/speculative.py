"""`localchat bench --draft-model SPEC` (or `--draft ngram|auto`) measured: decode speed with and without
the draft on the same prompts at temperature 0, with α, c, β and γ as the engine measured them,
and whether the outputs were identical (greedy speculation changes the speed, never the text);
and short one-shot replies, each with a fresh draft state, where drafting must not cost."""

from __future__ import annotations

import statistics
import sys

from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine import open_engine
from localchat.engine.config import EngineConfig

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
        "Give three tips for staying focused while studying, with a reason for each.",
        "Compare Python lists and tuples: when would you use each?",
        "Write a polite email asking a neighbour to turn their music down at night.",
    ),
    "quote": (  # replies that copy their prompt: where prompt lookup pays
        "Repeat the following text exactly, fixing only its spelling mistakes:\n\n" + PASSAGE,
        "Rewrite the following text word for word, but change every 'river' to 'stream':\n\n"
        + PASSAGE,
        "Correct the grammar of the following text and give it back in full:\n\n" + PASSAGE,
    ),
}
# one-shot replies (`localchat run PROMPT -n 64`): each with a fresh draft state, as a new
# process has; where nothing is accepted, drafting must not cost the reply
SHORT = (
    "Say hi.",
    "What is the capital of France? Answer in one sentence.",
    "Give me three fruit names.",
    "Write a haiku about autumn.",
    "How do I reverse a list in Python?",
    "What is 12 times 7?",
)
SHORT_TOKENS = 64
SHORT_REPEATS = 5
QUOTE_REPEATS = 2  # the one-shot quote: each quote prompt this often from a fresh engine
GREEDY = SamplingParams(temperature=0.0)


def _decode(engine, prompt: str, gen_tokens: int) -> tuple[float, tuple[int, ...], dict]:
    """One greedy reply: (decode tok/s, its tokens, the draft's stats)."""
    tokens: list[int] = []
    result = None
    for event in engine.generate(Request(messages=[Message("user", prompt)], sampling=GREEDY,
                                         max_tokens=gen_tokens)):
        tokens += getattr(event, "token_ids", ())
        result = event
    return result.stats.decode_tok_s, tuple(tokens), result.stats.draft or {}


def alpha_of(drafts: list[dict]) -> float:
    """α per token over requests' draft stats, as in the speedup formula: kept drafts over
    judged ones (a round's drafts after its first miss were never judged)."""
    judged = sum(d.get("judged", 0) for d in drafts)
    return sum(d.get("accepted", 0) for d in drafts) / judged if judged else 0.0


def _task(plain, drafted, prompts, gen_tokens: int) -> dict:
    """Each prompt plain, with the draft, plain again: a ratio against the two plain runs
    around it, so drift on a shared machine cancels (each prompt once: the draft remembers)."""
    base_rates, rates, ratios, drafts, identical = [], [], [], [], True
    for prompt in prompts:
        before, base_out, _ = _decode(plain, prompt, gen_tokens)
        rate, out, stats = _decode(drafted, prompt, gen_tokens)
        after = _decode(plain, prompt, gen_tokens)[0]
        base = (before + after) / 2
        base_rates.append(base)
        rates.append(rate)
        ratios.append(rate / base if base else 0.0)
        drafts.append(stats)
        identical = identical and out == base_out

    def mean(key):
        values = [d[key] for d in drafts if d.get(key) is not None and d.get("proposed")]
        return statistics.mean(values) if values else None

    return {
        "no_draft_tok_s": statistics.median(base_rates), "draft_tok_s": statistics.median(rates),
        "speedup": statistics.median(ratios),
        "alpha": alpha_of(drafts),
        "c": mean("c"), "beta": mean("beta"), "gamma": drafts[-1].get("gamma"),
        "predicted_speedup": mean("predicted_speedup"),
        "engine_measured_speedup": mean("measured_speedup"),  # the controller's own figure
        "tokens_per_target_pass": statistics.mean(d.get("tokens_per_target_pass", 1.0) for d in drafts),
        "identical_output": identical, "prompts": len(prompts),
        "per_prompt": {"no_draft_tok_s": base_rates, "draft_tok_s": rates, "draft_stats": drafts},
    }


def _fresh(config: EngineConfig, prompt: str) -> tuple[float, tuple[int, ...], dict]:
    """One reply from a freshly loaded engine, as a one-shot `run` has it (its KV memory
    and draft state new)."""
    engine = open_engine(config)
    try:
        return _decode(engine, prompt, SHORT_TOKENS)
    finally:
        engine.close()


def _one_shot(config: EngineConfig, prompts=SHORT, repeats: int = SHORT_REPEATS) -> dict:
    """Each prompt `repeats` times: without a draft, with it, without again, each on a
    freshly loaded engine (a one-shot `run` against `run --no-draft`). Per prompt the median
    ratio (a reply of a few tokens is a few milliseconds: one run is mostly noise); the
    lowest of those, and the lowest among prompts whose replies kept no draft."""
    plain = config.without_draft()
    ratios, kept_none, drafts, identical, own, own_none = [], [], [], True, [], []
    for prompt in prompts:
        runs, kept = [], 0
        for _ in range(repeats):
            before, base_out, _ = _fresh(plain, prompt)
            rate, out, stats = _fresh(config, prompt)
            after = _fresh(plain, prompt)[0]
            runs.append(rate / ((before + after) / 2) if before + after else 0.0)
            kept += stats.get("accepted", 0)
            identical = identical and out == base_out
            own.append(stats.get("own_steps_speedup") or 1.0)
            if not stats.get("accepted"):
                own_none.append(own[-1])
        drafts.append(stats)
        ratios.append(statistics.median(runs))
        if not kept:
            kept_none.append(ratios[-1])
    return {"speedup": statistics.median(ratios), "lowest": min(ratios),
            "lowest_nothing_kept": min(kept_none) if kept_none else None,
            "replies_nothing_kept": len(kept_none),
            # every drafted reply's speedup in its own run's plain steps (no run-to-run noise)
            "own_steps_lowest": min(own), "own_steps_lowest_nothing_kept":
                min(own_none) if own_none else None, "alpha": alpha_of(drafts),
            "proposed": sum(d.get("proposed", 0) for d in drafts), "identical_output": identical,
            "own_steps_median": statistics.median(own),
            "prompts": len(prompts), "gen_tokens": SHORT_TOKENS, "repeats": repeats,
            "per_prompt": {"ratio": ratios, "draft_stats": drafts}}


def bench_speculative(config: EngineConfig, gen_tokens: int) -> dict:
    """The target loaded twice (plain, and with the draft), each prompt run on both; speedup
    is the median of the per-prompt ratios. Top-level figures are the chat task's."""
    plain = open_engine(config.without_draft())
    try:
        drafted = open_engine(config)
        try:
            source = getattr(getattr(drafted, "draft", None), "source", config.draft.label())
            print(f"benchmarking draft {source} against no draft…", file=sys.stderr)
            warm = Request(messages=[Message("user", "Hi")], sampling=GREEDY, max_tokens=4)
            plain.complete(warm)
            drafted.complete(warm)
            tasks = {task: _task(plain, drafted, prompts, gen_tokens)
                     for task, prompts in TASKS.items()}
        finally:
            drafted.close()
    finally:
        plain.close()
    print("benchmarking short and quoting one-shot replies, each engine loaded afresh…",
          file=sys.stderr)
    short = _one_shot(config)
    quote = _one_shot(config, TASKS["quote"], QUOTE_REPEATS)
    head = {k: v for k, v in tasks["chat"].items() if k != "per_prompt"}
    return {"draft": config.draft.record(), "source": source, "engine": config.engine,
            "gen_tokens": gen_tokens, **head, "tasks": tasks, "short": short,
            "quote_one_shot": quote}


def format_speculative(s: dict) -> str:
    def num(value, fmt: str = ".2f") -> str:
        return "n/a" if value is None else format(value, fmt)

    lines = [f"speculative decoding, draft {s['source']} ({s['engine']} engine), temperature 0, "
             f"median over prompts × {s['gen_tokens']} tokens (each between two plain runs)",
             f"  {'task':6s} {'no draft':>9s} {'draft':>9s} {'speedup':>8s} {'α':>5s} {'c':>5s} "
             f"{'β':>5s} {'γ':>3s} {'predicted':>9s} {'engine':>7s} {'tok/pass':>8s}  identical"]
    for task, t in s["tasks"].items():
        lines.append(
            f"  {task:6s} {t['no_draft_tok_s']:9.1f} {t['draft_tok_s']:9.1f} {t['speedup']:7.2f}x "
            f"{t['alpha']:5.2f} {num(t['c']):>5s} {num(t['beta']):>5s} {t['gamma']!s:>3s} "
            f"{num(t['predicted_speedup']):>8s}x {num(t.get('engine_measured_speedup')):>6s}x "
            f"{t['tokens_per_target_pass']:8.2f}  "
            f"{'yes' if t['identical_output'] else 'NO'}")
    short = s.get("short")
    if short:
        lowest = short["lowest_nothing_kept"]
        lines.append(
            f"  short  {short['prompts']} one-shot prompts × {short['gen_tokens']} tokens, a fresh "
            f"draft each, median of {short.get('repeats', 1)} runs a prompt: median "
            f"{short['speedup']:.2f}x, lowest {short['lowest']:.2f}x; "
            f"{short['replies_nothing_kept']} kept no draft"
            + (f" (lowest {lowest:.2f}x)" if lowest is not None else "")
            + f", {short['proposed']} drafts proposed, identical "
            f"{'yes' if short['identical_output'] else 'NO'}")
        own = short.get("own_steps_lowest_nothing_kept")
        lines.append(
            f"         in each reply's own plain steps: lowest {short['own_steps_lowest']:.3f}x"
            + (f", lowest where none was kept {own:.3f}x" if own is not None else ""))
    quote = s.get("quote_one_shot")
    if quote:
        lines.append(
            f"  quote, one-shot: {quote['prompts']} quote prompts × {quote['gen_tokens']} tokens, "
            f"a fresh engine each, median of {quote['repeats']} runs a prompt: median "
            f"{quote['speedup']:.2f}x, lowest {quote['lowest']:.2f}x; in own plain steps median "
            f"{quote['own_steps_median']:.2f}x, α {quote['alpha']:.2f}, {quote['proposed']} "
            f"drafts proposed, identical {'yes' if quote['identical_output'] else 'NO'}")
    lines.append("  (tok/s: decode rate; α: drafts kept ÷ proposed; c: a draft step ÷ a target "
                 "step; β: a verify pass's extra cost per draft token, in target steps; predicted: from "
                 "α, c, β; engine: the speedup the controller measured against its timed plain "
                 "steps)")
    return "\n".join(lines)
