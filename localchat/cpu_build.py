"""llama.cpp built for this CPU, safely. The set-up (Makefile) asks this file, run as a script
before anything is installed (standard library only), for the CMake flags of this x86-64 CPU's
instruction sets (AVX-512, VNNI, BF16 where present; never AMX, which VMs report without
granting) and a key naming them: the built wheel is kept per key, and the key is recorded in
the virtualenv. At run time required_missing() tells, before libllama is loaded, whether this
CPU lacks an instruction set the build used (a virtualenv carried to another machine): one
line instead of a SIGILL.

    python3 localchat/cpu_build.py cmake-args | key | record VENV"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from pathlib import Path

RECORD = "localchat-llama-cpu.json"  # in the virtualenv's root (sys.prefix)
# ggml's CMake option -> the /proc/cpuinfo flags it compiles for (all of them needed)
OPTIONS = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_BMI2": ("bmi2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512f", "avx512vbmi"),
    "GGML_AVX512_VNNI": ("avx512f", "avx512_vnni"),
    "GGML_AVX512_BF16": ("avx512f", "avx512_bf16"),
}
NEVER = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")  # crash where not granted (issue 41)
PORTABLE = ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C")


def applies() -> bool:
    """Only x86-64 Linux builds are set per CPU (macOS: Metal; elsewhere llama.cpp's own)."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The instruction-set flags the kernel reports (and has enabled the state for)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def options_for(flags: set[str]) -> dict[str, bool]:
    """Each of ggml's x86 options, on where this CPU has what it compiles for. A CPU
    below the portable level (no AVX2) gets the portable build's options unchanged."""
    on = {name: all(f in flags for f in needs) for name, needs in OPTIONS.items()}
    if not all(on[name] for name in PORTABLE):
        on = {name: name in PORTABLE for name in OPTIONS}
    return {**on, **{name: False for name in NEVER}}


def cmake_args(flags: set[str]) -> str:
    options = options_for(flags)
    return " ".join(["-DGGML_NATIVE=OFF"] + [f"-D{k}={'ON' if v else 'OFF'}"
                                               for k, v in options.items()])


def key(flags: set[str], args: str | None = None) -> str:
    """A short name for the build: the options on beyond the portable ones, and a digest of
    the whole CMake line (a user's own CMAKE_ARGS key their own wheel)."""
    args = cmake_args(flags) if args is None else args
    extra = [k.removeprefix("GGML_").lower() for k, v in options_for(flags).items()
             if v and k not in PORTABLE]
    level = "-".join(["avx2", *extra]) if args == cmake_args(flags) else "custom"
    return f"{level}-{hashlib.sha256(args.encode()).hexdigest()[:8]}"


def required(args: str) -> list[str]:
    """The CPU flags a build with these CMake flags needs to run."""
    needs: list[str] = []
    for option, flags in OPTIONS.items():
        if f"-D{option}=ON" in args.split():
            needs += [f for f in flags if f not in needs]
    return needs


def required_missing(prefix: str | None = None, cpuinfo: str | None = None) -> list[str]:
    """The instruction sets the set-up's llama.cpp build needs and this CPU lacks ([] where
    nothing was recorded: a build the set-up did not make)."""
    path = Path(prefix or sys.prefix) / RECORD
    try:
        needs = json.loads(path.read_text())["requires"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    have = cpu_flags(cpuinfo)
    return [f for f in needs if f not in have] if have else []


def record(venv: str, args: str) -> None:
    data = {"cmake_args": args, "requires": required(args), "key": key(cpu_flags(), args)}
    (Path(venv) / RECORD).write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str]) -> int:
    flags = cpu_flags()
    if argv[:1] == ["cmake-args"]:
        print(cmake_args(flags))
    elif argv[:1] == ["key"]:
        print(key(flags, argv[1] if len(argv) > 1 else None))
    elif argv[:1] == ["record"] and len(argv) == 3:
        record(argv[1], argv[2])
    else:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
