"""What this machine's CPU is and which instruction-set extensions the OS reports for it
(/proc/cpuinfo's flags on Linux; empty elsewhere). Read once per process."""

from __future__ import annotations

import platform
from functools import lru_cache


@lru_cache(maxsize=None)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    name, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = frozenset(value.split())
                if name and flags:
                    break
    except OSError:
        pass
    return name or platform.processor() or platform.machine(), flags


def cpu_name() -> str:
    """The processor's model name, e.g. 'AMD EPYC 7B13'."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them ('avx2', 'avx512_vnni', 'amx_int8', ...)."""
    return _cpuinfo()[1]


def is_x86_64() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def has_avx2() -> bool:
    """An x86-64 CPU with AVX2, FMA and F16C: what llama.cpp's haswell variant and
    localchat's q4q8 kernels need."""
    return is_x86_64() and {"avx2", "fma", "f16c"} <= cpu_flags()
