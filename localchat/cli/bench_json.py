"""`localchat bench --task json`'s table (the measuring is bench/json_task.py)."""

from __future__ import annotations


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
