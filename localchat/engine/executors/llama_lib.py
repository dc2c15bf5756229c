"""The one place llama_cpp is imported from: first a check that this CPU runs the llama.cpp
the set-up built (cpu_build.py recorded the instruction sets it needs), so a virtualenv
carried to an older CPU says so in one line instead of dying with SIGILL inside libllama."""

from __future__ import annotations

from localchat.cpu_build import required_missing
from localchat.errors import EngineError


def check_build(prefix: str | None = None, cpuinfo: str | None = None) -> None:
    """EngineError naming what this CPU lacks, if the build needs more than it has."""
    missing = required_missing(prefix, cpuinfo)
    if missing:
        raise EngineError(f"llama.cpp in this environment was built for a CPU with "
                          f"{', '.join(missing)}, which this one lacks: run `make setup` to "
                          "rebuild it for this CPU")


check_build()

import llama_cpp  # noqa: E402 -- only after the check: loading libllama may run its code
from llama_cpp._internals import LlamaContext, LlamaModel  # noqa: E402

__all__ = ["llama_cpp", "LlamaContext", "LlamaModel", "check_build"]
