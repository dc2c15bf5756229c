"""The one place llama_cpp is imported from: first a check that this CPU runs the llama.cpp
the set-up built (cpu_build.py recorded the instruction sets it needs), so a virtualenv
carried to an older CPU says so in one line instead of dying with SIGILL inside libllama.
Only the ctypes bindings load; the package's high-level half loads when first asked for."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading

from localchat.cpu_build import required_missing
from localchat.errors import EngineError


def check_build(prefix: str | None = None, cpuinfo: str | None = None) -> None:
    """EngineError naming what this CPU lacks, if the build needs more than it has."""
    missing = required_missing(prefix, cpuinfo)
    if missing:
        raise EngineError(f"llama.cpp in this environment was built for a CPU with "
                          f"{', '.join(missing)}, which this one lacks: run `make setup` to "
                          "rebuild it for this CPU")


def _register_lazy_package() -> None:
    """Put the llama_cpp package in sys.modules without running its __init__, which imports
    the Llama class, chat formats and jinja2 (50-60 ms of a one-shot start we never use);
    the first name asked of the package that it lacks runs __init__, so `import llama_cpp;
    llama_cpp.Llama` elsewhere in the process works as usual."""
    if "llama_cpp" in sys.modules:
        return
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.loader is None:
        raise EngineError("llama-cpp-python is not installed: run `make setup`")
    package = importlib.util.module_from_spec(spec)
    lock = threading.Lock()

    def complete(name: str):
        submodule = sys.modules.get(f"llama_cpp.{name}")
        if submodule is not None:  # `import llama_cpp.x as y` while x is still importing
            return submodule
        with lock:
            if package.__dict__.pop("__getattr__", None) is not None:
                bindings = sys.modules["llama_cpp.llama_cpp"]
                callback, data = bindings.llama_log_callback(), ctypes.c_void_p()
                bindings.llama_log_get(ctypes.byref(callback), ctypes.byref(data))
                spec.loader.exec_module(package)  # its _logger sets a callback printing to stderr
                bindings.llama_log_set(callback, data)  # the log stays where it went
        return getattr(package, name)

    package.__getattr__ = complete
    sys.modules["llama_cpp"] = package
    bindings = importlib.import_module("llama_cpp.llama_cpp")  # __init__'s first line:
    package.__dict__.update({k: v for k, v in vars(bindings).items()  # from .llama_cpp import *
                             if not k.startswith("_")})


check_build()
_register_lazy_package()

import llama_cpp.llama_cpp as llama_cpp  # noqa: E402 -- only after the check: loading libllama may run its code
from llama_cpp._internals import LlamaContext, LlamaModel  # noqa: E402

__all__ = ["llama_cpp", "LlamaContext", "LlamaModel", "check_build"]
