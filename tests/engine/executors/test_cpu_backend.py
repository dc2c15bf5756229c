"""What computes, named (issue 41): llama.cpp's CPU backend variant and its instruction sets,
the torch kernels' ISA; and, in a GGML_BACKEND_DL build, the variant chosen at run time
(never AMX unless asked, a forced lower one giving the same greedy reply)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localchat.cpu_features import cpu_flags, has_avx2
from localchat.engine.executors.llamacpp_backends import (AMX_VARIANTS, VARIANT_ENV,
                                                          choose_variant, variant_files)
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


LOGITS = """
import sys
import numpy as np
from localchat.engine.executors.llamacpp import LlamaCppExecutor
from localchat.engine.runtime.executor_api import Chunk
from localchat.models.specs import resolve_model_facts
ex = LlamaCppExecutor(resolve_model_facts("default"), n_ctx=256, threads=2, parallel=1)
tokens = ex.vocab.tokenize_text("The capital of France is Paris. The capital of Italy is Rome. "
                                "Water boils at one hundred degrees. The largest planet is")
logits = ex.forward([Chunk(0, tokens, 0, len(tokens), list(range(16)), 0)])
np.save(sys.argv[1], logits)
print(ex.info.compute)
ex.close()
"""
MARGIN = 2.0  # logits apart: the lowest variant rounds differently (up to 1.3 seen, Zen 3)


def _logits(tmp_path: Path, variant: str | None) -> tuple[str, np.ndarray]:
    """(what computed, every prompt position's logits) from a fresh process, the CPU
    variant forced by $LOCALCHAT_GGML_CPU where given."""
    out = tmp_path / f"{variant or 'best'}.npy"
    env = {k: v for k, v in os.environ.items() if k != VARIANT_ENV}
    env.update({VARIANT_ENV: variant} if variant else {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", LOGITS, str(out)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1], np.load(out)


@pytest.mark.subprocess
@pytest.mark.skipif(not variant_files(), reason="this llama-cpp-python links its CPU backend in "
                                                 "(built without GGML_BACKEND_DL)")
def test_forced_lower_variants_run_and_agree_with_the_best(tmp_path):
    best_compute, best = _logits(tmp_path, None)
    assert not any(f"variant {v} " in best_compute for v in AMX_VARIANTS)
    top2 = np.sort(best, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > MARGIN  # positions whose greedy token is not a near tie
    lower = ["haswell"] if has_avx2() and "haswell" in variant_files() else []
    for variant in lower + ["x64"]:  # AVX2 only (no AVX-512, no AMX); any x86-64
        compute, logits = _logits(tmp_path, variant)
        assert compute.startswith(f"llama.cpp CPU variant {variant} ("), compute
        if f"variant {variant} " in best_compute:
            assert np.array_equal(logits, best)
            continue
        assert clear.any()
        assert (logits.argmax(1) == best.argmax(1))[clear].all(), variant
        assert np.sqrt(((logits - best) ** 2).mean() / (best ** 2).mean()) < 0.1, variant
