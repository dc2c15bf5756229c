"""Human-readable numbers, one way everywhere (CLI tables, stats blocks, gauges)."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'. Binary units, as llama.cpp and free(1) print them."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_rate(tok_s: float) -> str:
    return f"{tok_s:.1f} tok/s" if tok_s > 0 else "–"
