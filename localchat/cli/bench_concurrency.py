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
