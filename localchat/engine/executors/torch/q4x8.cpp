// localchat's 8-row interleaved Q4_0, Q4_1 and Q4_K ops (q4x8.py: Q4S8x8Linear, Q41x8Linear,
// Q4Kx8Linear), as ggml's repacked AVX2 GEMM/GEMV (repack.cpp) work: one activation load and
// one scale multiply serve 8 weight rows, and each output lane is one weight row, so no
// horizontal sums. Compiled after q4q8.cpp in the same translation unit (it uses
// quantize_rows). Every activation row runs the same arithmetic in the same order whether it
// sits in a 4-row tile or alone, so a row gets the same bits alone as in a batch.
namespace {

// Codes of 8 weight rows for one 32-block, 128 bytes: [chunk c 0..3][row r 0..7][byte k 0..3],
// byte k of chunk c holding weights 4c + k (low nibble) and 16 + 4c + k (high nibble).
constexpr int64_t X8_BLOCK = 128;

inline int32_t load_4_bytes(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Per activation row j < T: lane r = Σ over the block of q[r]·x[j] as int16 pairs (exact:
// |code · x| ≤ 15 · 127, eight pairs a lane at most 30480). x: row j at x + j·K.
template <int T>
inline void block_sums(const uint8_t* codes, const int8_t* x, int64_t K, __m256i* s16) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < T; ++j) s16[j] = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i b = _mm256_loadu_si256((const __m256i*)(codes + 32 * c));
    const __m256i lo = _mm256_and_si256(b, nibble);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble);
    for (int j = 0; j < T; ++j) {
      const int8_t* xj = x + j * K + 4 * c;
      s16[j] = _mm256_add_epi16(s16[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_4_bytes(xj))));
      s16[j] = _mm256_add_epi16(s16[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_4_bytes(xj + 16))));
    }
  }
}

// T activation rows against 8 Q4_0 weight rows: per block the exact Σ (q − 8)·x (llama.cpp's
// integer), times d (the 8 rows' float16 scales) · dx, summed over the blocks in order.
// out[j]: 8 floats, one per weight row.
template <int T>
inline void tile_q4_0(const uint8_t* codes, const uint16_t* d, int64_t G, int64_t K,
                      const int8_t* xq, const float* dx, const int32_t* bsum, __m256* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int j = 0; j < T; ++j) out[j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256i s16[T];
    block_sums<T>(codes + g * X8_BLOCK, xq + g * 32, K, s16);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(d + g * 8)));
    for (int j = 0; j < T; ++j) {
      const __m256i isum = _mm256_sub_epi32(_mm256_madd_epi16(s16[j], ones),
                                            _mm256_set1_epi32(8 * bsum[j * G + g]));
      out[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                               _mm256_mul_ps(dw, _mm256_set1_ps(dx[j * G + g])), out[j]);
    }
  }
}

// T activation rows against 8 Q4_1 weight rows, as llama.cpp's Q4_1 dot: per block the exact
// Σ q·x times d · dx, plus the offset m times sx (Q8_1's fp16 dx·Σ codes), each summed over
// the blocks in order in its own accumulator. dm: per block the 8 rows' float16 d, then m.
template <int T>
inline void tile_q4_1(const uint8_t* codes, const uint16_t* dm, int64_t G, int64_t K,
                      const int8_t* xq, const float* dx, const float* sx, __m256* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 offsets[T];
  for (int j = 0; j < T; ++j) out[j] = offsets[j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256i s16[T];
    block_sums<T>(codes + g * X8_BLOCK, xq + g * 32, K, s16);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(dm + g * 16)));
    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(dm + g * 16 + 8)));
    for (int j = 0; j < T; ++j) {
      out[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16[j], ones)),
                               _mm256_mul_ps(dw, _mm256_set1_ps(dx[j * G + g])), out[j]);
      offsets[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx[j * G + g]), offsets[j]);
    }
  }
  for (int j = 0; j < T; ++j) out[j] = _mm256_add_ps(out[j], offsets[j]);
}

// T activation rows against 8 Q4_K weight rows, as llama.cpp's Q4_K dot: per 256 weights the
// 32s' integer sums times their 6-bit scales summed as integers, times d · dx; the offsets
// Σ m · Σ codes likewise, times dmin · dx; out = the first minus the second. sc: [G][8 rows];
// mn: [G/2][8 rows][2 groups]; sup: [G/8][d of 8 rows, dmin of 8 rows]; bsum16: Σ codes per 32.
template <int T>
inline void tile_q4_k(const uint8_t* codes, const uint8_t* sc, const uint8_t* mn, const float* sup,
                      int64_t G, int64_t K, const int8_t* xq, const float* dx, const int16_t* bsum16,
                      __m256* out) {
  __m256 acc[T], offsets[T];
  for (int j = 0; j < T; ++j) acc[j] = offsets[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < G / 8; ++b) {
    __m256i isum[T];
    for (int j = 0; j < T; ++j) isum[j] = _mm256_setzero_si256();
    for (int64_t g = 8 * b; g < 8 * b + 8; ++g) {
      __m256i s16[T];
      block_sums<T>(codes + g * X8_BLOCK, xq + g * 32, K, s16);
      const __m256i s32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(sc + g * 8)));
      const __m256i scv = _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16));  // sc in both halves
      for (int j = 0; j < T; ++j) isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(s16[j], scv));
    }
    __m256i m16[4];  // groups 2p, 2p + 1's mins as int16 pairs, lane r for row r
    for (int p = 0; p < 4; ++p)
      m16[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(mn + (4 * b + p) * 16)));
    const __m256 d8 = _mm256_loadu_ps(sup + 16 * b), dmin8 = _mm256_loadu_ps(sup + 16 * b + 8);
    for (int j = 0; j < T; ++j) {
      __m256i msum = _mm256_setzero_si256();
      for (int p = 0; p < 4; ++p)
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m16[p], _mm256_set1_epi32(
                                          load_4_bytes(bsum16 + j * G + 8 * b + 2 * p))));
      const __m256 dxb = _mm256_set1_ps(dx[j * G + 8 * b]);
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(d8, dxb), acc[j]);
      offsets[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin8, dxb), offsets[j]);
    }
  }
  for (int j = 0; j < T; ++j) out[j] = _mm256_sub_ps(acc[j], offsets[j]);
}

// y [M, N] from x [M, K] and N weight rows in tiles of 8 (the last one padded): `tile(T, m,
// t, out)` computes rows m .. m + T − 1 against tile t. Tiles are shared among threads; a
// thread's activations go in blocks of 64 rows, each used by all its tiles while in L2.
template <class Tile>
at::Tensor x8_mm(int64_t M, int64_t N, const at::TensorOptions& options, const Tile& tile) {
  at::Tensor y = at::empty({M, N}, options);
  float* Y = y.data_ptr<float>();
  const int64_t tiles = (N + 7) / 8, m_block = 64;
  at::parallel_for(0, tiles, 2, [&](int64_t t0, int64_t t1) {
    for (int64_t m0 = 0; m0 < M; m0 += m_block) {
      const int64_t m1 = std::min(M, m0 + m_block);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t cols = std::min<int64_t>(8, N - 8 * t);
        auto put = [&](int T, int64_t m, const __m256* out) {
          for (int j = 0; j < T; ++j) {
            float* yr = Y + (m + j) * N + 8 * t;
            if (cols == 8) {
              _mm256_storeu_ps(yr, out[j]);
            } else {
              alignas(32) float lanes[8];
              _mm256_store_ps(lanes, out[j]);
              std::memcpy(yr, lanes, cols * sizeof(float));
            }
          }
        };
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) {
          __m256 out[4];
          tile(std::integral_constant<int, 4>(), m, t, out);
          put(4, m, out);
        }
        for (; m < m1; ++m) {
          __m256 out[1];
          tile(std::integral_constant<int, 1>(), m, t, out);
          put(1, m, out);
        }
      }
    }
  });
  return y;
}

// A call's activations [M, K] as float32, rounded as llama.cpp's `act` (quantize_rows)
struct Rounded {
  at::Tensor x;
  int64_t M, K, G;
  std::vector<int8_t> xq;
  std::vector<float> dx, sx;
  Rounded(const at::Tensor& x_in, int act)
      : x(x_in.contiguous().to(at::kFloat)), M(x.size(0)), K(x.size(1)), G(K / 32), xq(M * K),
        dx(M * G), sx(M * G) {
    TORCH_CHECK(K % (act == Q8_K ? 256 : 32) == 0, "q4x8: rows of whole blocks");
    quantize_rows(x.data_ptr<float>(), M, K, act, xq.data(), dx.data(), sx.data());
  }
};

// Q4_0 repacked: codes [N8/8, G, 128] as X8_BLOCK, d float16 [N8/8, G, 8]; n: the rows wanted
at::Tensor q4s8x8_mm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& d, int64_t n) {
  Rounded a(x_in, Q8_0);
  const int64_t M = a.M, K = a.K, G = a.G;
  const std::vector<int8_t>& xq = a.xq;
  TORCH_CHECK(codes.numel() == (n + 7) / 8 * G * X8_BLOCK && d.numel() == (n + 7) / 8 * G * 8 &&
              d.scalar_type() == at::kHalf, "q4s8x8: shapes");
  std::vector<int32_t> bsum(M * G);
  for (int64_t r = 0; r < M * G; ++r) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += xq[r * 32 + i];
    bsum[r] = sum;
  }
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const uint16_t* D = (const uint16_t*)d.data_ptr();
  return x8_mm(M, n, a.x.options(), [&](auto rows, int64_t m, int64_t t, __m256* out) {
    constexpr int T = decltype(rows)::value;
    tile_q4_0<T>(C + t * G * X8_BLOCK, D + t * G * 8, G, K, xq.data() + m * K, a.dx.data() + m * G,
                 bsum.data() + m * G, out);
  });
}

// Q4_1 repacked: codes as q4s8x8's, dm float16 [N8/8, G, 2, 8] (d, m); x rounded to Q8_1
at::Tensor q41x8_mm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& dm, int64_t n) {
  Rounded a(x_in, Q8_1);
  const int64_t K = a.K, G = a.G;
  TORCH_CHECK(codes.numel() == (n + 7) / 8 * G * X8_BLOCK && dm.numel() == (n + 7) / 8 * G * 16 &&
              dm.scalar_type() == at::kHalf, "q41x8: shapes");
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const uint16_t* DM = (const uint16_t*)dm.data_ptr();
  return x8_mm(a.M, n, a.x.options(), [&](auto rows, int64_t m, int64_t t, __m256* out) {
    constexpr int T = decltype(rows)::value;
    tile_q4_1<T>(C + t * G * X8_BLOCK, DM + t * G * 16, G, K, a.xq.data() + m * K,
                 a.dx.data() + m * G, a.sx.data() + m * G, out);
  });
}

// Q4_K repacked: codes as q4s8x8's, sc [N8/8, G, 8], mn [N8/8, G/2, 8, 2] (6-bit integers),
// sup float32 [N8/8, G/8, 2, 8] (d, dmin); x rounded to Q8_K
at::Tensor q4kx8_mm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& sc,
                    const at::Tensor& mn, const at::Tensor& sup, int64_t n) {
  Rounded a(x_in, Q8_K);
  const int64_t M = a.M, K = a.K, G = a.G, tiles = (n + 7) / 8;
  const std::vector<int8_t>& xq = a.xq;
  TORCH_CHECK(codes.numel() == tiles * G * X8_BLOCK && sc.numel() == tiles * G * 8 &&
              mn.numel() == tiles * G * 8 && sup.numel() == tiles * G * 2 &&
              sup.scalar_type() == at::kFloat, "q4kx8: shapes");
  std::vector<int16_t> bsum(M * G);  // |Σ| ≤ 32 · 127
  for (int64_t r = 0; r < M * G; ++r) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += xq[r * 32 + i];
    bsum[r] = (int16_t)sum;
  }
  const uint8_t *C = codes.data_ptr<uint8_t>(), *SC = sc.data_ptr<uint8_t>(), *MN = mn.data_ptr<uint8_t>();
  const float* SUP = sup.data_ptr<float>();
  return x8_mm(M, n, a.x.options(), [&](auto rows, int64_t m, int64_t t, __m256* out) {
    constexpr int T = decltype(rows)::value;
    tile_q4_k<T>(C + t * G * X8_BLOCK, SC + t * G * 8, MN + t * G * 8, SUP + t * G * 2, G, K,
                 xq.data() + m * K, a.dx.data() + m * G, bsum.data() + m * G, out);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(localchat, m) {
  m.def("q4s8x8_mm(Tensor x, Tensor codes, Tensor d, int n) -> Tensor");
  m.def("q41x8_mm(Tensor x, Tensor codes, Tensor dm, int n) -> Tensor");
  m.def("q4kx8_mm(Tensor x, Tensor codes, Tensor sc, Tensor mn, Tensor sup, int n) -> Tensor");
}
TORCH_LIBRARY_IMPL(localchat, CPU, m) {
  m.impl("q4s8x8_mm", &q4s8x8_mm);
  m.impl("q41x8_mm", &q41x8_mm);
  m.impl("q4kx8_mm", &q4kx8_mm);
}
