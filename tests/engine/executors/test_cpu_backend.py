"""What computes, named (issue 41): llama.cpp's CPU backend variant and its instruction sets,
the torch kernels' ISA; and, in a GGML_BACKEND_DL build, the variant chosen at run time
(never AMX unless asked, a forced lower one giving the same greedy reply)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from localchat.cpu_features import cpu_flags, has_avx2
from localchat.engine.executors.llamacpp_backends import (AMX_VARIANTS, choose_variant,
                                                          variant_files)
from localchat.errors import EngineError

# llama_print_system_info's names -> /proc/cpuinfo's
LINUX_FLAG = {"SSE3": "pni", "SSSE3": "ssse3", "SSE42": "sse4_2", "AVX": "avx", "AVX2": "avx2",
              "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2", "AVX_VNNI": "avx_vnni",
              "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni",
              "AVX512_BF16": "avx512_bf16", "AMX_INT8": "amx_int8", "AMX_BF16": "amx_bf16"}
CHECKOUT = Path(__file__).resolve().parents[3]


def test_the_best_runnable_variant_is_chosen_and_amx_only_when_allowed():
    scores = {"x64": 1, "haswell": 60, "sapphirerapids": 900, "skylakex": 0}
    assert choose_variant(scores, None, amx_allowed=False) == "haswell"
    assert choose_variant(scores, None, amx_allowed=True) == "sapphirerapids"
    assert choose_variant(scores, "x64", amx_allowed=False) == "x64"
    with pytest.raises(EngineError, match="skylakex: this CPU lacks an instruction set"):
        choose_variant(scores, "skylakex", amx_allowed=False)
    with pytest.raises(EngineError, match="no such CPU variant .it has haswell, "):
        choose_variant(scores, "zen9", amx_allowed=False)
    with pytest.raises(EngineError, match="no llama.cpp CPU backend variant runs"):
        choose_variant({"skylakex": 0, "sapphirerapids": 5}, None, amx_allowed=False)
    assert AMX_VARIANTS == ("sapphirerapids",)


def _named_features(compute: str) -> list[str]:
    match = re.fullmatch(r"llama\.cpp CPU (?:variant \S+|linked in) \(([A-Z0-9_ ]+)\)", compute)
    assert match, compute
    return match[1].split()


def test_the_llama_cpp_engine_names_its_cpu_backend_and_only_features_this_cpu_has(engine):
    features = _named_features(engine.info.compute)
    if cpu_flags():
        assert all(LINUX_FLAG[f] in cpu_flags() for f in features if f in LINUX_FLAG), features
    if has_avx2():  # the build in use is never below the haswell level on such a CPU
        assert {"AVX", "AVX2", "FMA", "F16C"} <= set(features)


def test_the_torch_engine_names_its_kernels_isa(torch_engine):
    compute = torch_engine.info.compute
    assert compute.startswith("torch CPU capability "), compute
    if has_avx2():
        vnni = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= cpu_flags()
        assert compute.endswith(f"q4q8 kernels {'avx512-vnni' if vnni else 'avx2'}"), compute


def _greedy_reply(env_extra: dict[str, str]) -> dict:
    code = (
        "import json\n"
        "from localchat.engine import open_engine\n"
        "from localchat.engine.config import EngineConfig\n"
        "from helpers.replies import reply_tokens\n"
        "e = open_engine(EngineConfig(engine='llama.cpp', ctx_size=256, threads=2))\n"
        "print(json.dumps({'compute': e.info.compute,\n"
        "                  'tokens': reply_tokens(e, 'Name three colours.', 24)[0]}))\n"
        "e.close()\n")
    env = {**os.environ, **env_extra,
           "PYTHONPATH": os.pathsep.join([str(CHECKOUT), str(CHECKOUT / "tests"),
                                          os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not variant_files(), reason="this llama-cpp-python links its CPU backend in "
                                                 "(built without GGML_BACKEND_DL)")
def test_a_forced_lower_variant_runs_and_replies_the_same():
    best = _greedy_reply({})
    assert not any(f"variant {v} " in best["compute"] for v in AMX_VARIANTS)
    lower = "haswell" if has_avx2() and "variant haswell" not in best["compute"] else "x64"
    forced = _greedy_reply({"LOCALCHAT_GGML_CPU": lower})
    assert forced["compute"].startswith(f"llama.cpp CPU variant {lower} ")
    assert forced["tokens"] == best["tokens"]
