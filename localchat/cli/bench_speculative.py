"""`localchat bench --draft-model`'s table; bench/speculative.py measures."""

from __future__ import annotations


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
    lines.append("  (tok/s: decode rate; α: drafts kept ÷ proposed; c: a draft step ÷ a target "
                 "step; β: a verify pass's extra cost per draft token, in target steps; predicted: from "
                 "α, c, β; engine: the speedup the controller measured against its timed plain "
                 "steps)")
    return "\n".join(lines)
