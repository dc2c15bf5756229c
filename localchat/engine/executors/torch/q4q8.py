"""4- and 8-bit GGUF blocks times int8-quantized activations, as llama.cpp computes them on
x86: integer dot products per 32 weights (AVX2). A C++ op (`localchat::q4q8_mm`,
`localchat::q8q8_mm`) built once per machine into the cache dir; kernels.py offers it where
it builds and measures it against PyTorch's own kernels."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
from functools import lru_cache

import torch

from localchat.errors import EngineError
from localchat.paths import cache_dir

GROUP = 32  # weights per scale: GGUF's blocks

_SOURCE = r"""
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

namespace {

// Each row of x in 32-value groups: int8 codes and one scale per group (llama.cpp's Q8).
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* xq, float* dx, float* sx) {
  const int64_t G = K / 32;
  for (int64_t r = 0; r < M * G; ++r) {
    const float* v = x + r * 32;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = (int)std::nearbyint(v[i] * id);
      xq[r * 32 + i] = (int8_t)q;
      sum += q;
    }
    dx[r] = d;
    sx[r] = d * (float)sum;
  }
}

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(lo, _mm_movehdup_ps(lo)));
}

// T rows of activations against one weight row; every row runs the same arithmetic in the
// same order whatever T is, so a row gets the same bits alone as in a batch.
template <int T, bool Q4>
inline void rows_dot(const uint8_t* wr, const float* dr, const float* mr, int64_t G, int64_t K,
                     const int8_t* xq, const float* dx, const float* sx, float* y, int64_t ystride) {
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[T];
  for (int j = 0; j < T; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256i w;
    if (Q4) {
      const __m128i b = _mm_loadu_si128((const __m128i*)(wr + g * 16));
      w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), nibble);
    } else {
      w = _mm256_loadu_si256((const __m256i*)(wr + g * 32));
    }
    const __m256 dw = _mm256_set1_ps(dr[g]);
    for (int j = 0; j < T; ++j) {
      const __m256i xv = _mm256_loadu_si256((const __m256i*)(xq + j * K + g * 32));
      const __m256i p16 = Q4 ? _mm256_maddubs_epi16(w, xv)
                             : _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
      const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
      acc[j] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_broadcast_ss(dx + j * G + g)), acc[j]);
    }
  }
  for (int j = 0; j < T; ++j) {
    float out = hsum(acc[j]);
    if (Q4)
      for (int64_t g = 0; g < G; ++g) out += mr[g] * sx[j * G + g];
    y[j * ystride] = out;
  }
}

template <bool Q4>
at::Tensor blocks_mm(const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& d,
                     const at::Tensor& mn) {
  const at::Tensor x = x_in.contiguous().to(at::kFloat);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), G = K / 32;
  TORCH_CHECK(K % 32 == 0 && d.size(0) == N && d.size(1) == G, "q4q8: shapes");
  std::vector<int8_t> xq(M * K);
  std::vector<float> dx(M * G), sx(M * G);
  quantize_rows(x.data_ptr<float>(), M, K, xq.data(), dx.data(), sx.data());
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* W = w.data_ptr<uint8_t>();
  const float* D = d.data_ptr<float>();
  const float* MN = Q4 ? mn.data_ptr<float>() : nullptr;
  float* Y = y.data_ptr<float>();
  const int64_t row_bytes = Q4 ? K / 2 : K;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wr = W + n * row_bytes;
      const float* dr = D + n * G;
      const float* mr = Q4 ? MN + n * G : nullptr;
      int64_t m = 0;
      for (; m + 4 <= M; m += 4)
        rows_dot<4, Q4>(wr, dr, mr, G, K, xq.data() + m * K, dx.data() + m * G, sx.data() + m * G, Y + m * N + n, N);
      for (; m < M; ++m)
        rows_dot<1, Q4>(wr, dr, mr, G, K, xq.data() + m * K, dx.data() + m * G, sx.data() + m * G, Y + m * N + n, N);
    }
  });
  return y;
}

at::Tensor q4q8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn) {
  return blocks_mm<true>(x, w, d, mn);
}
at::Tensor q8q8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d) {
  return blocks_mm<false>(x, w, d, d);
}

}  // namespace

TORCH_LIBRARY(localchat, m) {
  m.def("q4q8_mm(Tensor x, Tensor w, Tensor d, Tensor mn) -> Tensor");
  m.def("q8q8_mm(Tensor x, Tensor w, Tensor d) -> Tensor");
}
TORCH_LIBRARY_IMPL(localchat, CPU, m) {
  m.impl("q4q8_mm", &q4q8_mm);
  m.impl("q8q8_mm", &q8q8_mm);
}
"""


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags") and ":" in line:
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@lru_cache(maxsize=None)
def available() -> bool:
    """Whether the op is loaded in this process: an x86-64 CPU with AVX2 and FMA, and a C++
    compiler for the first build (~20 s, then loaded from the cache dir)."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= _cpu_flags():
        return False
    if not any(shutil.which(cc) for cc in ("g++", "c++")):
        return False
    digest = hashlib.blake2b(f"{torch.__version__}{_SOURCE}".encode(), digest_size=8).hexdigest()
    build = cache_dir() / "kernels" / f"q4q8-{digest}"
    built = build / "localchat_q4q8.so"
    try:
        try:
            torch.ops.load_library(str(built))  # no ninja run: the name is the source's hash
        except OSError:  # not built yet, or damaged: build it beside, then put it in place
            _build(build)
    except Exception as exc:  # noqa: BLE001 -- no toolchain or headers: PyTorch's kernels only
        logging.getLogger("localchat.engine").info("q4q8 kernel not built (%s)", exc)
        return False
    torch.library.register_fake("localchat::q4q8_mm")(
        lambda x, w, d, mn: x.new_empty(x.shape[0], w.shape[0], dtype=torch.float32))
    torch.library.register_fake("localchat::q8q8_mm")(
        lambda x, w, d: x.new_empty(x.shape[0], w.shape[0], dtype=torch.float32))
    return True


def _build(build) -> None:
    """Compile and load the op in a private folder renamed to `build` when complete, so an
    interrupted or concurrent build never leaves a half-written library there."""
    from torch.utils.cpp_extension import load_inline

    shutil.rmtree(build, ignore_errors=True)
    private = build.with_name(f"{build.name}.{os.getpid()}")
    shutil.rmtree(private, ignore_errors=True)
    private.mkdir(parents=True)
    load_inline("localchat_q4q8", cpp_sources=_SOURCE, is_python_module=False,
                extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
                extra_ldflags=["-fopenmp"], build_directory=str(private))
    try:
        private.rename(build)
    except OSError:  # another process put its build there first
        shutil.rmtree(private, ignore_errors=True)


class Q4Q8Linear(torch.nn.Module):
    """y = x @ Wᵀ for W = (q − 8)·scale + zero in 32-weight groups (Q4_0, Q4_1, Q4_K: exact),
    with x rounded to int8 per 32 values as llama.cpp does."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                 device: torch.device = torch.device("cpu"), group: int = GROUP) -> None:
        super().__init__()
        if device.type != "cpu" or group != GROUP or q.shape[1] % GROUP or not available():
            raise EngineError("the q4q8 kernel needs an AVX2 CPU and 32-weight groups")
        self.out_features, self.in_features = q.shape
        g = q.to(torch.uint8).view(q.shape[0], -1, 2, 16)  # byte i: weight i low, i + 16 high
        self.packed = (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(q.shape[0], -1).contiguous()
        self.scale = scale.float().contiguous()
        self.minimum = (zero.float() - 8 * scale.float()).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.localchat.q4q8_mm(x.reshape(-1, self.in_features), self.packed,
                                        self.scale, self.minimum)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class Q8Q8Linear(torch.nn.Module):
    """y = x @ Wᵀ for Q8_0 (int8 codes, one scale per 32: exact), x rounded as in Q4Q8Linear."""

    def __init__(self, codes: torch.Tensor, d: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__()
        if device.type != "cpu" or codes.shape[1] % GROUP or not available():
            raise EngineError("the q8q8 kernel needs an AVX2 CPU")
        self.out_features, self.in_features = codes.shape
        self.codes = codes.to(torch.int8).contiguous().view(torch.uint8)
        self.scale = d.float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.localchat.q8q8_mm(x.reshape(-1, self.in_features), self.codes, self.scale)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
