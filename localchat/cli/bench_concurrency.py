"""`localchat bench --concurrency`'s levels and table; bench/concurrency.py measures."""

from __future__ import annotations

from localchat.bench.concurrency import GEN_TOKENS, MODES, knees
from localchat.errors import UsageError


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--concurrency takes numbers like 1,4,16, got {text!r}") from None
    if not levels or levels[0] < 1 or levels[-1] > 256:
        raise UsageError(f"--concurrency levels must be 1..256, got {text!r}")
    return levels


def format_concurrency(table: dict[str, dict]) -> str:
    lines = [f"{GEN_TOKENS} tokens per request; aggregate tok/s, p50 / max latency (s)",
             f"{'N':>4}" + "".join(f"{mode:>28}" for mode in MODES)]
    for n, row in sorted(table.items(), key=lambda kv: int(kv[0])):
        cells = [f"{row[m]['aggregate_tok_s']:.1f}  {row[m]['p50_latency_s']:.2f}/"
                 f"{row[m]['max_latency_s']:.2f}" for m in MODES]
        lines.append(f"{n:>4}" + "".join(f"{c:>28}" for c in cells))
    for mode, level in knees(table).items():
        lines.append(f"knee ({mode}): " + (
            f"past {level} concurrent requests throughput grows < 15% while latency rises"
            if level is not None else "none within the measured levels"))
    return "\n".join(lines)


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
