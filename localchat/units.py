"""Human-readable numbers, one way everywhere (CLI tables, stats blocks, gauges)."""

from __future__ import annotations

import os
import re

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'. Binary units, as llama.cpp and free(1) print them."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_memory(text: str) -> int:
    """'8GB' -> 8e9, '16GiB' -> 16·2^30, '512MiB', '1e9'."""
    from localchat.errors import UsageError

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"cannot read memory size {text!r} (try 8GB or 16GiB)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise UsageError(f"memory size must be positive, got {text!r}")
    return value


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int:
    """Memory the OS can give now (Linux MemAvailable; else physical free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def refuse_beyond_available(needed: int, what: str) -> None:
    """UsageError, before allocating, when `what` needs more memory than the OS has now."""
    from localchat.errors import UsageError

    available = available_memory()
    if needed > available:
        raise UsageError(f"{what} needs {human_bytes(needed)} and {human_bytes(available)} is "
                         "available: use a smaller -c/--ctx-size (or fewer -np slots)")
