"""llama.cpp's CPU backend, chosen at run time. A build with GGML_BACKEND_DL and
GGML_CPU_ALL_VARIANTS ships one libggml-cpu-<variant>.so per instruction-set level and
registers none: load_cpu_backend() loads the best variant this CPU scores (ggml's own
ggml_backend_score, as ggml_backend_load_best does), never an AMX one unless asked
(LOCALCHAT_GGML_AMX=1), or the variant LOCALCHAT_GGML_CPU names. A build with the CPU
backend linked in (the portable default) needs nothing. cpu_backend() names what runs."""

from __future__ import annotations

import ctypes
import os
import re
import threading
from pathlib import Path

from localchat.engine.executors.llama_lib import llama_cpp

from localchat.errors import EngineError

VARIANT_ENV = "LOCALCHAT_GGML_CPU"  # e.g. haswell, sse42, x64: this variant, or an error
AMX_ENV = "LOCALCHAT_GGML_AMX"  # "1": AMX variants may be chosen (ggml's AMX code crashes on
# VMs that report AMX without granting it, issue 41)
AMX_VARIANTS = ("sapphirerapids",)  # GGML_CPU_ALL_VARIANTS' variants compiled with AMX tiles
VARIANT_FILE = re.compile(r"^libggml-cpu-(.+)\.so$")
# llama_print_system_info's flags that name instruction sets (not OPENMP, REPACK, ...)
ISA_FEATURES = ("SSE3", "SSSE3", "SSE42", "AVX", "AVX_VNNI", "AVX2", "F16C", "FMA", "BMI2",
                "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8", "AMX_BF16",
                "NEON", "ARM_FMA", "FP16_VA", "DOTPROD", "MATMUL_INT8", "SVE", "SVE2", "SME")

_lock = threading.Lock()
_loaded: list[str] = []  # the variant load_cpu_backend() loaded ("" for a linked-in backend)


def library_dir() -> Path:
    """Where llama-cpp-python loads libllama from (its LLAMA_CPP_LIB_PATH, else its lib/)."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    return Path(override) if override else Path(llama_cpp.__file__).parent / "lib"


def variant_files(lib_dir: Path | None = None) -> dict[str, Path]:
    """variant name -> file: beside libllama, or in the wheel's bin/ where ggml's install
    rule puts backend modules (CMAKE_INSTALL_BINDIR)."""
    lib_dir = lib_dir or library_dir()
    found: dict[str, Path] = {}
    for folder in (lib_dir, lib_dir.parent.parent / "bin"):
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                match = VARIANT_FILE.match(path.name)
                if match and match[1] not in found:
                    found[match[1]] = path
    return found


def variant_score(path: Path) -> int:
    """ggml_backend_score() of a variant: 0 where this CPU (or OS) lacks a feature it was
    compiled for. That function is built without the variant's flags, so asking is safe."""
    import _ctypes

    lib = ctypes.CDLL(str(path))
    try:
        score = getattr(lib, "ggml_backend_score", None)
        if score is None:
            return 0
        score.restype = ctypes.c_int
        return int(score())
    finally:
        _ctypes.dlclose(lib._handle)


def choose_variant(scores: dict[str, int], forced: str | None, amx_allowed: bool) -> str:
    """The variant to load: `forced` if this CPU runs it, else the highest score, AMX
    variants only if allowed. EngineError when none runs here."""
    if forced:
        if forced not in scores:
            raise EngineError(f"${VARIANT_ENV}={forced}: this llama.cpp build has no such CPU "
                              f"variant (it has {', '.join(sorted(scores)) or 'none'})")
        if scores[forced] <= 0:
            raise EngineError(f"${VARIANT_ENV}={forced}: this CPU lacks an instruction set "
                              "that variant needs")
        return forced
    runnable = {name: s for name, s in scores.items()
                if s > 0 and (amx_allowed or name not in AMX_VARIANTS)}
    if not runnable:
        raise EngineError("no llama.cpp CPU backend variant runs on this CPU "
                          f"(found {', '.join(sorted(scores)) or 'none'})")
    return max(runnable, key=lambda name: (runnable[name], name))


def _ggml() -> ctypes.CDLL:
    """The libggml libllama loaded (by its soname: its registry is the one llama.cpp reads,
    wherever its RUNPATH found it); else the one beside libllama."""
    try:
        lib = ctypes.CDLL("libggml.so.0", mode=os.RTLD_NOLOAD)
    except OSError:
        lib = ctypes.CDLL(str(library_dir() / "libggml.so"))
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_load.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_load.restype = ctypes.c_void_p
    return lib


def load_cpu_backend() -> str:
    """Load the CPU variant where the build registers no backend of its own; its name, or
    "" for a build with the CPU backend linked in. Once per process."""
    with _lock:
        if _loaded:
            return _loaded[0]
        ggml = _ggml()
        files = variant_files()
        if ggml.ggml_backend_reg_count() > 0 or not files:
            if os.environ.get(VARIANT_ENV):
                raise EngineError(f"${VARIANT_ENV} is set, but this llama.cpp build has its "
                                  "CPU backend linked in (built without GGML_BACKEND_DL)")
            _loaded.append("")
            return ""
        scores = {name: variant_score(path) for name, path in files.items()}
        name = choose_variant(scores, os.environ.get(VARIANT_ENV) or None,
                              os.environ.get(AMX_ENV) == "1")
        if not ggml.ggml_backend_load(str(files[name]).encode()):
            raise EngineError(f"llama.cpp could not load its CPU backend {files[name]}")
        _loaded.append(name)
        return name


def cpu_features() -> list[str]:
    """The instruction sets llama.cpp's CPU backend in use was built for and runs."""
    info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    on = set(re.findall(r"(\w+) = 1", info))
    return [name for name in ISA_FEATURES if name in on]


def cpu_backend() -> str:
    """What computes on the CPU, for --verbose and bench --json: e.g. 'llama.cpp CPU variant
    haswell (SSE3 SSSE3 AVX AVX2 F16C FMA BMI2)' or 'llama.cpp CPU, linked in (...)'."""
    variant = load_cpu_backend()
    kind = f"variant {variant}" if variant else "linked in"
    return f"llama.cpp CPU {kind} ({' '.join(cpu_features()) or 'no SIMD'})"
