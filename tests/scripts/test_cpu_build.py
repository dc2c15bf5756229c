"""The set-up's llama.cpp build per CPU (localchat/cpu_build.py): the CMake flags follow the
CPU's instruction sets (AVX-512 levels where present, never AMX), an AVX2-only CPU gets
exactly the portable build's flags, keys differ per level, and a build carried to a CPU that
lacks what it needs is one line, checked before libllama loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localchat import cpu_build
from localchat.engine.executors.llama_lib import check_build
from localchat.errors import EngineError

ZEN3 = ("fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand "
        "bmi1 avx2 bmi2 sha_ni vaes vpclmulqdq")
ZEN4 = ZEN3 + (" avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi "
               "avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq")
SPR = ZEN4 + " avx_vnni amx_bf16 amx_tile amx_int8"
# what the portable build (-DGGML_NATIVE=OFF alone) turned on: ggml-config.cmake of 0.3.36
PORTABLE_ON = {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C"}


def flags(line: str) -> set[str]:
    return cpu_build.cpu_flags(f"processor : 0\nflags\t\t: {line}\n")


def on(args: str) -> set[str]:
    return {a[2:-3] for a in args.split() if a.endswith("=ON")}


def test_an_avx2_cpu_gets_the_portable_build_unchanged():
    assert on(cpu_build.cmake_args(flags(ZEN3))) == PORTABLE_ON
    assert "-DGGML_NATIVE=OFF" in cpu_build.cmake_args(flags(ZEN3))


def test_avx512_levels_are_built_where_present_and_amx_never():
    zen4 = on(cpu_build.cmake_args(flags(ZEN4)))
    assert zen4 == PORTABLE_ON | {"GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI",
                                  "GGML_AVX512_BF16"}
    spr = cpu_build.cmake_args(flags(SPR))
    assert on(spr) == zen4 | {"GGML_AVX_VNNI"}
    assert "-DGGML_AMX_TILE=OFF" in spr and "-DGGML_AMX_INT8=OFF" in spr


def test_a_cpu_below_avx2_gets_the_portable_flags():
    assert on(cpu_build.cmake_args(flags("sse sse2 sse4_2 avx"))) == PORTABLE_ON


def test_each_level_has_its_own_key_and_a_users_own_flags_another():
    keys = {cpu_build.key(flags(cpu)) for cpu in (ZEN3, ZEN4, SPR)}
    assert len(keys) == 3
    assert cpu_build.key(flags(ZEN3)).startswith("avx2-")
    assert cpu_build.key(flags(ZEN4)).startswith("avx2-avx512-")
    assert cpu_build.key(flags(ZEN3), "-DGGML_CUDA=on").startswith("custom-")


def test_a_build_for_another_cpu_is_one_line_before_libllama_loads(tmp_path):
    cpu_build.record(str(tmp_path), cpu_build.cmake_args(flags(ZEN4)))
    recorded = json.loads((tmp_path / cpu_build.RECORD).read_text())
    assert "avx512f" in recorded["requires"] and "amx_tile" not in recorded["requires"]
    zen3_info = f"flags : {ZEN3}\n"
    assert "avx512f" in cpu_build.required_missing(str(tmp_path), zen3_info)
    with pytest.raises(EngineError) as info:
        check_build(str(tmp_path), zen3_info)
    assert "\n" not in str(info.value) and "make setup" in str(info.value)
    check_build(str(tmp_path), f"flags : {ZEN4}\n")  # the CPU it was built for
    check_build(str(tmp_path / "nothing recorded"), zen3_info)  # a build we did not make


@pytest.mark.subprocess
def test_the_makefile_asks_this_file_as_a_script():
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "localchat" / "cpu_build.py"), "cmake-args"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.startswith("-DGGML_NATIVE=OFF") or not cpu_build.applies()
    assert "cpu_build.py cmake-args" in (root / "Makefile").read_text()
