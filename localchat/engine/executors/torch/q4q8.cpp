// localchat's q4q8 ops (see q4q8.py): GGUF blocks times activations rounded as llama.cpp
// rounds them, with its integer dot products. Built once per machine by q4q8.py.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

enum Act { Q8_0 = 0, Q8_1 = 1, Q8_K = 2 };  // llama.cpp's rounding of a matmul's activations
enum Fmt { W4 = 0, W5 = 1, W8 = 2, W6K = 3, W5M = 4, W3K = 5, W2K = 6, W4S = 7 };  // how a row is held

// Formats with an offset per 32 weights (w = q·d + minimum)
template <int F> constexpr bool with_minimum() { return F == W4 || F == W5M; }
// Formats whose codes are unsigned bytes as loaded (the rest are signed)
template <int F> constexpr bool unsigned_codes() { return F == W4 || F == W5M || F == W2K; }
// Formats with a sub-scale per 16 weights and d per 256 (the K-quants Q6_K, Q3_K, Q2_K):
// int8, or for W2K a byte holding the scale (low nibble) and the offset's (high nibble)
template <int F> constexpr bool per_16() { return F == W6K || F == W3K || F == W2K; }
// What the VNNI path adds to a signed format's codes to make them unsigned
template <int F> constexpr int code_offset() {
  return F == W5 ? 16 : F == W8 ? 128 : F == W6K ? 32 : F == W3K ? 4 : F == W4S ? 8 : 0;
}
// Formats whose per-32 scale is held as the file's float16 (W4S: Q4_0 in its own 4.5 bits)
template <int F> constexpr bool half_scales() { return F == W4S; }
template <int F> inline float scale_at(const float* dr, int64_t g) {
  if (half_scales<F>()) return _cvtsh_ss(((const uint16_t*)dr)[g]);
  return dr[g];
}
template <int F> inline int sub_scale(const int8_t* sr, int64_t i) {
  return F == W2K ? (uint8_t)sr[i] & 0x0F : sr[i];
}
// Formats with a plane of high bits beside the codes (W6K: 2 bits a weight, two uint32 per
// 32 weights; the others 1 bit, one uint32)
template <int F> constexpr bool with_bit_plane() { return F == W5 || F == W5M || F == W3K || F == W6K; }

inline int64_t load_8_bytes(const uint8_t* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline float fp16_rounded(float v) { return _cvtsh_ss(_cvtss_sh(v, 0)); }

// Each row of x rounded as llama.cpp's quantize_row_q8_0 / _q8_1 (32 values, fp16 scale;
// Q8_1 also an fp16 d·Σq) or quantize_row_q8_K (256 values, float scale). Per 32 values:
// int8 codes, the scale dx, and sx = the scale times Σ codes (the weights' offset term).
void quantize_rows(const float* x, int64_t M, int64_t K, int act, int8_t* xq, float* dx, float* sx) {
  if (act == Q8_K) {
    for (int64_t b = 0; b < M * K / 256; ++b) {
      const float* v = x + b * 256;
      float amax = 0.f, max = 0.f;
      for (int i = 0; i < 256; ++i)
        if (std::fabs(v[i]) > amax) { amax = std::fabs(v[i]); max = v[i]; }
      const float iscale = amax > 0.f ? -127.f / max : 0.f, d = amax > 0.f ? 1.f / iscale : 0.f;
      for (int g = 0; g < 8; ++g) {
        int sum = 0;
        for (int i = 0; i < 32; ++i) {
          const int q = std::min(127, (int)std::nearbyint(iscale * v[g * 32 + i]));
          xq[b * 256 + g * 32 + i] = (int8_t)q;
          sum += q;
        }
        dx[b * 8 + g] = d;
        sx[b * 8 + g] = d * (float)sum;
      }
    }
    return;
  }
  for (int64_t r = 0; r < M * K / 32; ++r) {
    const float* v = x + r * 32;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = (int)std::nearbyint(v[i] * id);
      xq[r * 32 + i] = (int8_t)q;
      sum += q;
    }
    dx[r] = fp16_rounded(d);
    sx[r] = act == Q8_1 ? fp16_rounded(d * (float)sum) : dx[r] * (float)sum;
  }
}

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(lo, _mm_movehdup_ps(lo)));
}

// 0xFF in byte i where bit i of `plane` is set
inline __m256i bit_mask(uint32_t plane) {
  const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0);
  const __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)plane), spread);
  return _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                           _mm256_set1_epi64x(-1));
}

// W3K's 32 2-bit codes from 8 bytes: byte i holds weights i, i + 8, i + 16, i + 24 in its
// bit pairs from the lowest; as bytes 0..3 in weight order
inline __m256i two_bit_codes(const uint8_t* p) {
  return _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(load_8_bytes(p)),
                                            _mm256_set_epi64x(6, 4, 2, 0)), _mm256_set1_epi8(3));
}

// Group g's 32 weights as bytes: W4 unsigned nibbles 0..15, W5M unsigned 0..31 (the nibble
// and its fifth bit from qh), W2K unsigned 0..3; the others signed (W5: the same 5 bits minus
// 16, as llama.cpp's Q5_0 dot product does; W3K: 2 bits and the plane's bit as 4, minus 4,
// as Q3_K's; W6K: the nibble and 2 bits from qh as 16s, minus 32, as Q6_K's).
template <int F>
inline __m256i load_group(const uint8_t* wr, const uint32_t* hr, int64_t g) {
  if (F == W8) return _mm256_loadu_si256((const __m256i*)(wr + g * 32));
  if (F == W2K) return two_bit_codes(wr + g * 8);
  if (F == W3K) {
    const __m256i w = _mm256_or_si256(two_bit_codes(wr + g * 8),
                                      _mm256_and_si256(bit_mask(hr[g]), _mm256_set1_epi8(4)));
    return _mm256_sub_epi8(w, _mm256_set1_epi8(4));
  }
  const __m128i b = _mm_loadu_si128((const __m128i*)(wr + g * 16));
  __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
  if (F == W4S) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));  // Q4_0: q − 8, as llama.cpp's dot
  if (F == W5)
    w = _mm256_or_si256(w, _mm256_andnot_si256(bit_mask(hr[g]), _mm256_set1_epi8((char)0xF0)));
  if (F == W5M)
    w = _mm256_or_si256(w, _mm256_and_si256(bit_mask(hr[g]), _mm256_set1_epi8(0x10)));
  if (F == W6K)  // two_bit_codes' values are at most 3: the 16-bit shift keeps them in their byte
    w = _mm256_sub_epi8(_mm256_or_si256(w, _mm256_slli_epi16(two_bit_codes((const uint8_t*)hr + g * 8), 4)),
                        _mm256_set1_epi8(32));
  return w;
}

// Q2_K's offset term for one row: per 256 weights dmin times Σ per 16 of its offset m (the
// high nibble of the 16's scale byte) times dx · Σ codes there (sx16)
inline float q2k_minimum(const int8_t* sr, const float* dmin, const float* sx16, int64_t K) {
  float out = 0.f;
  for (int64_t b = 0; b < K / 256; ++b) {
    const __m128i bytes = _mm_loadu_si128((const __m128i*)(sr + b * 16));
    const __m128i m = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(m, 8)));
    const __m256 s = _mm256_fmadd_ps(hi, _mm256_loadu_ps(sx16 + b * 16 + 8),
                                     _mm256_mul_ps(lo, _mm256_loadu_ps(sx16 + b * 16)));
    out += dmin[b] * hsum(s);
  }
  return out;
}

// T rows of activations against one weight row; every row runs the same arithmetic in the
// same order whatever T is, so a row gets the same bits alone as in a batch.
template <int T, int F>
inline void rows_dot(const uint8_t* wr, const uint32_t* hr, const float* dr, const int8_t* sr,
                     const float* mr, int64_t G, int64_t K, const int8_t* xq, const float* dx,
                     const float* sx, float* y, int64_t ystride) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[T];
  for (int j = 0; j < T; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const __m256i w = load_group<F>(wr, hr, g);
    const __m256i wa = unsigned_codes<F>() ? w : _mm256_sign_epi8(w, w);
    // K-quants: a scale per 16 weights (lanes 0-3, 4-7), d per 256 times a sub-scale
    const __m256 dw = per_16<F>()
        ? _mm256_mul_ps(_mm256_set1_ps(dr[g / 8]), _mm256_cvtepi32_ps(_mm256_set_m128i(
              _mm_set1_epi32(sub_scale<F>(sr, 2 * g + 1)), _mm_set1_epi32(sub_scale<F>(sr, 2 * g)))))
        : _mm256_set1_ps(scale_at<F>(dr, g));
    for (int j = 0; j < T; ++j) {
      const __m256i xv = _mm256_loadu_si256((const __m256i*)(xq + j * K + g * 32));
      const __m256i p16 = _mm256_maddubs_epi16(wa, unsigned_codes<F>() ? xv : _mm256_sign_epi8(xv, w));
      const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
      acc[j] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_broadcast_ss(dx + j * G + g)), acc[j]);
    }
  }
  for (int j = 0; j < T; ++j) {
    float out = hsum(acc[j]);
    if (with_minimum<F>())
      for (int64_t g = 0; g < G; ++g) out += mr[g] * sx[j * G + g];
    if (F == W2K) out -= q2k_minimum(sr, mr, sx + j * 2 * G, K);
    y[j * ystride] = out;
  }
}

// A 256-block's offset term for one row of activations, added to `acc`: its 8 mins (m8) times
// the Σ codes of their 32s (bsum), times dmin · dx
inline __m256 k_offsets(__m256i m8, const int32_t* bsum, float dmin_dx, __m256 acc) {
  const __m256i mb = _mm256_mullo_epi32(m8, _mm256_loadu_si256((const __m256i*)bsum));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(mb), _mm256_set1_ps(dmin_dx), acc);
}

// Q4_K and Q5_K as llama.cpp's dot products take them: per 256 weights, the 32s' integer sums
// times their 6-bit scales summed as integers, then one float multiply by d · dx (the same
// for the offsets: Σ m · Σ codes, times dmin · dx). sc, mn: [G] integers; sup: (d, dmin) per
// 256; bsum: Σ codes per 32.
template <int T, int F>
inline void rows_dot_k(const uint8_t* wr, const uint32_t* hr, const uint8_t* sc, const uint8_t* mn,
                       const float* sup, int64_t G, int64_t K, const int8_t* xq, const float* dx,
                       const int32_t* bsum, float* y, int64_t ystride) {
  __m256 acc[T], offsets[T];
  for (int j = 0; j < T; ++j) acc[j] = offsets[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < G / 8; ++b) {
    const __m256i m8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(mn + 8 * b)));
    __m256i isum[T];
    for (int j = 0; j < T; ++j) isum[j] = _mm256_setzero_si256();
    for (int64_t g = 8 * b; g < 8 * b + 8; ++g) {
      const __m256i w = load_group<F>(wr, hr, g);
      const __m256i scv = _mm256_set1_epi16(sc[g]);
      for (int j = 0; j < T; ++j) {
        const __m256i xv = _mm256_loadu_si256((const __m256i*)(xq + j * K + g * 32));
        isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), scv));
      }
    }
    for (int j = 0; j < T; ++j) {
      const float dxb = dx[j * G + 8 * b];
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_set1_ps(sup[2 * b] * dxb), acc[j]);
      offsets[j] = k_offsets(m8, bsum + j * G + 8 * b, sup[2 * b + 1] * dxb, offsets[j]);
    }
  }
  for (int j = 0; j < T; ++j) y[j * ystride] = hsum(acc[j]) - hsum(offsets[j]);
}

// The same sums with AVX-512 VNNI, two groups (64 weights) per instruction: every format as
// unsigned bytes (W5 +16, W8 +128, W6K +32, W3K +4, W4S +8 on its codes; W4, W5M, W2K as they are) times the int8 codes
// (vpdpbusd), the offset taken back exactly in int32 by starting each group's first lane (W6K:
// each 16's) at -offset * Σ codes. Used where the CPU has it and a row holds an even number
// of groups; every row of a call takes the same path, so rows still batch exactly.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

bool has_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni");
  const char* isa = std::getenv("LOCALCHAT_Q4Q8_ISA");  // "avx2": the path every x86 CPU takes
  return yes && !(isa && std::string(isa) == "avx2");
}

template <int F>
inline __m512i load_pair(const uint8_t* wr, const uint32_t* hr, int64_t g) {
  if (F == W8) return _mm512_xor_si512(_mm512_loadu_si512(wr + g * 32), _mm512_set1_epi8((char)0x80));
  if (F == W2K)
    return _mm512_inserti64x4(_mm512_castsi256_si512(two_bit_codes(wr + g * 8)),
                              two_bit_codes(wr + g * 8 + 8), 1);
  if (F == W3K) {  // unsigned: the code + 4
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(two_bit_codes(wr + g * 8)),
                                         two_bit_codes(wr + g * 8 + 8), 1);
    const __mmask64 bits = (__mmask64)hr[g] | ((__mmask64)hr[g + 1] << 32);
    return _mm512_or_si512(w, _mm512_maskz_set1_epi8(bits, 0x04));
  }
  const __m256i b = _mm256_loadu_si256((const __m256i*)(wr + g * 16));  // groups g, g+1
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m512i lo_hi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, m)),
                                           _mm256_and_si256(_mm256_srli_epi16(b, 4), m), 1);
  __m512i w = _mm512_shuffle_i64x2(lo_hi, lo_hi, _MM_SHUFFLE(3, 1, 2, 0));  // g lo hi, g+1 lo hi
  if (F == W5 || F == W5M) {
    const __mmask64 bits = (__mmask64)hr[g] | ((__mmask64)hr[g + 1] << 32);
    w = _mm512_or_si512(w, _mm512_maskz_set1_epi8(bits, 0x10));
  }
  if (F == W6K) {  // unsigned: the code + 32
    const uint8_t* h = (const uint8_t*)hr + g * 8;
    const __m512i high = _mm512_inserti64x4(_mm512_castsi256_si512(two_bit_codes(h)), two_bit_codes(h + 8), 1);
    w = _mm512_or_si512(w, _mm512_slli_epi16(high, 4));
  }
  return w;
}

template <int F>
inline __m512 pair_scale(const float* dr, const int8_t* sr, int64_t g) {
  if (per_16<F>()) {
    const __m128i bytes = _mm_cvtsi32_si128(*(const int32_t*)(sr + 2 * g));
    const __m512i sc = F == W2K ? _mm512_and_si512(_mm512_cvtepu8_epi32(bytes), _mm512_set1_epi32(0x0F))
                                : _mm512_cvtepi8_epi32(bytes);
    const __m512i quarter = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_mul_ps(_mm512_set1_ps(dr[g / 8]),
                         _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(quarter, sc)));
  }
  return _mm512_insertf32x8(_mm512_set1_ps(scale_at<F>(dr, g)), _mm256_set1_ps(scale_at<F>(dr, g + 1)), 1);
}

template <int T, int F>
inline void rows_dot_vnni(const uint8_t* wr, const uint32_t* hr, const float* dr, const int8_t* sr,
                          const float* mr, int64_t G, int64_t K, const int8_t* xq, const float* dx,
                          const int32_t* corr, const float* sx, float* y, int64_t ystride) {
  const __m512i by_group = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i by_16 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc[T];
  for (int j = 0; j < T; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; g += 2) {
    const __m512i w = load_pair<F>(wr, hr, g);
    const __m512 dw = pair_scale<F>(dr, sr, g);
    for (int j = 0; j < T; ++j) {
      const int64_t r = j * G + g;
      __m512i start = _mm512_setzero_si512();  // each group's first lane (W6K: each 16's)
      if (code_offset<F>() && !per_16<F>())
        start = _mm512_maskz_permutexvar_epi32(0x0101, by_group, _mm512_castsi128_si512(
            _mm_loadl_epi64((const __m128i*)(corr + r))));
      else if (code_offset<F>())
        start = _mm512_maskz_permutexvar_epi32(0x1111, by_16, _mm512_castsi128_si512(
            _mm_loadu_si128((const __m128i*)(corr + 2 * r))));
      const __m512i p = _mm512_dpbusd_epi32(start, w, _mm512_loadu_si512(xq + j * K + g * 32));
      const __m512 dxp = _mm512_permutexvar_ps(by_group, _mm512_castps128_ps512(
          _mm_castpd_ps(_mm_load_sd((const double*)(dx + r)))));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dxp), acc[j]);
    }
  }
  for (int j = 0; j < T; ++j) {
    float out = _mm512_reduce_add_ps(acc[j]);
    if (with_minimum<F>()) {
      __m512 m = _mm512_setzero_ps();
      for (int64_t g = 0; g < G; g += 16) {
        const __mmask16 k = G - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (G - g)) - 1);
        m = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, mr + g), _mm512_maskz_loadu_ps(k, sx + j * G + g), m);
      }
      out += _mm512_reduce_add_ps(m);
    }
    if (F == W2K) out -= q2k_minimum(sr, mr, sx + j * 2 * G, K);
    y[j * ystride] = out;
  }
}

// rows_dot_k with AVX-512, 64 weights at a time
template <int T, int F>
inline void rows_dot_k512(const uint8_t* wr, const uint32_t* hr, const uint8_t* sc, const uint8_t* mn,
                          const float* sup, int64_t G, int64_t K, const int8_t* xq, const float* dx,
                          const int32_t* bsum, float* y, int64_t ystride) {
  __m512 acc[T];
  __m256 offsets[T];
  for (int j = 0; j < T; ++j) acc[j] = _mm512_setzero_ps(), offsets[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < G / 8; ++b) {
    const __m256i m8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(mn + 8 * b)));
    __m512i isum[T];
    for (int j = 0; j < T; ++j) isum[j] = _mm512_setzero_si512();
    for (int64_t g = 8 * b; g < 8 * b + 8; g += 2) {
      const __m512i w = load_pair<F>(wr, hr, g);
      const __m512i scv = _mm512_inserti64x4(_mm512_set1_epi16(sc[g]), _mm256_set1_epi16(sc[g + 1]), 1);
      for (int j = 0; j < T; ++j) {
        const __m512i xv = _mm512_loadu_si512(xq + j * K + g * 32);
        isum[j] = _mm512_add_epi32(isum[j], _mm512_madd_epi16(_mm512_maddubs_epi16(w, xv), scv));
      }
    }
    for (int j = 0; j < T; ++j) {
      const float dxb = dx[j * G + 8 * b];
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_set1_ps(sup[2 * b] * dxb), acc[j]);
      offsets[j] = k_offsets(m8, bsum + j * G + 8 * b, sup[2 * b + 1] * dxb, offsets[j]);
    }
  }
  for (int j = 0; j < T; ++j) y[j * ystride] = _mm512_reduce_add_ps(acc[j]) - hsum(offsets[j]);
}

// Per row: -offset * Σ codes for each group (W6K, W3K: each 16), where its lanes start.
template <int F>
void vnni_corrections(const int8_t* xq, int64_t M, int64_t K, int32_t* corr) {
  const int offset = code_offset<F>();
  for (int64_t r = 0; r < M * K / 32; ++r) {
    int sums[2] = {0, 0};
    for (int i = 0; i < 32; ++i) sums[i / 16] += xq[r * 32 + i];
    if (per_16<F>()) {
      corr[2 * r] = -offset * sums[0];
      corr[2 * r + 1] = -offset * sums[1];
    } else {
      corr[r] = -offset * (sums[0] + sums[1]);
    }
  }
}

#pragma GCC pop_options

// y [M, N] = x [M, K] times N weight rows held as F: codes w, and per row qh (W5, W5M, W3K),
// scales d (per 32, or per 256 for the K-quants), sub-scales sc (K-quants: per 16), offsets
// mn (W4, W5M: per 32; W2K: dmin per 256). Per-32 scales and offsets come as float32, or for
// Q4_K and Q5_K as the 6-bit integers with (d, dmin) per 256 in sup (rows_dot_k).
template <int F>
at::Tensor blocks_mm(const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& qh,
                     const at::Tensor& d, const at::Tensor& sc, const at::Tensor& mn, int64_t act,
                     const at::Tensor& sup = at::Tensor()) {
  const at::Tensor x = x_in.contiguous().to(at::kFloat);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), G = K / 32;
  TORCH_CHECK(K % (act == Q8_K ? 256 : 32) == 0 && d.size(0) == N, "q4q8: shapes");
  std::vector<int8_t> xq(M * K);
  std::vector<float> dx(M * G), sx(M * G);
  quantize_rows(x.data_ptr<float>(), M, K, (int)act, xq.data(), dx.data(), sx.data());
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* W = w.data_ptr<uint8_t>();
  const uint32_t* H = with_bit_plane<F>() ? (const uint32_t*)qh.data_ptr() : nullptr;
  const int kind = !per_16<F>() && d.scalar_type() == at::kByte ? 2 : 0;  // 2: K-quant integers
  TORCH_CHECK(kind != 2 || (d.scalar_type() == at::kByte && sup.numel() == N * G / 4), "q4q8: scales");
  TORCH_CHECK(kind != 2 || (with_minimum<F>() && act == Q8_K), "q4q8: K-quant scales");
  const void* D = d.data_ptr();  // float32, or (kind 2) uint8
  const int8_t* SC = per_16<F>() ? sc.data_ptr<int8_t>() : nullptr;
  const bool offsets = with_minimum<F>() || F == W2K;
  const void* MN = offsets ? mn.data_ptr() : nullptr;
  const int64_t mn_row = F == W2K ? K / 256 : G;
  TORCH_CHECK(!half_scales<F>() || d.scalar_type() == at::kHalf, "q4q8: float16 scales");
  const size_t d_bytes = kind == 2 ? 1 : half_scales<F>() ? 2 : 4;
  float* Y = y.data_ptr<float>();
  const int64_t row_bytes = F == W3K || F == W2K ? K / 4 : F == W8 ? K : K / 2;
  const int64_t d_row = per_16<F>() ? K / 256 : G;
  const bool vnni = G % 2 == 0 && has_vnni();
  std::vector<int32_t> corr(vnni && code_offset<F>() ? (per_16<F>() ? 2 : 1) * M * G : 0);
  std::vector<int32_t> bsum(kind == 2 ? M * G : 0);  // Σ codes per 32, for K-quant offsets
  for (int64_t r = 0; r < (int64_t)bsum.size(); ++r) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += xq[r * 32 + i];
    bsum[r] = sum;
  }
  if (!corr.empty()) vnni_corrections<F>(xq.data(), M, K, corr.data());
  const int64_t per_row = corr.empty() ? 0 : per_16<F>() ? 2 * G : G;
  if (F == W2K) {  // its offsets need dx · Σ codes per 16 instead of per 32
    sx.resize(2 * M * G);
    for (int64_t h = 0; h < 2 * M * G; ++h) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += xq[h * 16 + i];
      sx[h] = dx[h / 2] * (float)sum;
    }
  }
  const int64_t sx_row = F == W2K ? 2 * G : G;
  // Activations in blocks of M_BLOCK rows, each used by every weight row of the thread's
  // share while it is in L2 (a prompt's rows would otherwise be read again for each weight row)
  const int64_t m_block = 64;  // 128 KB of int8 codes at K = 2048: 1.1x faster at 512 rows
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
   for (int64_t m0 = 0; m0 < M; m0 += m_block) {
    const int64_t m1 = std::min(M, m0 + m_block);
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wr = W + n * row_bytes;
      const uint32_t* hr = H ? H + n * (F == W6K ? 2 * G : G) : nullptr;
      const void* dr = (const char*)D + n * d_row * d_bytes;
      const int8_t* sr = SC ? SC + n * (K / 16) : nullptr;
      const void* mr = offsets ? (const char*)MN + n * mn_row * d_bytes : nullptr;
      auto rows = [&](auto tile, int64_t m) {  // rows m .. m + T - 1
        constexpr int T = decltype(tile)::value;
        const int8_t* x_rows = xq.data() + m * K;
        const float* dx_rows = dx.data() + m * G;
        if constexpr (with_minimum<F>()) {
          if (kind == 2) {
            const float* sup_row = sup.data_ptr<float>() + n * (G / 8) * 2;
            if (vnni)
              rows_dot_k512<T, F>(wr, hr, (const uint8_t*)dr, (const uint8_t*)mr, sup_row, G, K,
                                  x_rows, dx_rows, bsum.data() + m * G, Y + m * N + n, N);
            else
              rows_dot_k<T, F>(wr, hr, (const uint8_t*)dr, (const uint8_t*)mr, sup_row, G, K,
                               x_rows, dx_rows, bsum.data() + m * G, Y + m * N + n, N);
            return;
          }
        }
        if (vnni)
          rows_dot_vnni<T, F>(wr, hr, (const float*)dr, sr, (const float*)mr, G, K, x_rows, dx_rows,
                              corr.data() + m * per_row, sx.data() + m * sx_row, Y + m * N + n, N);
        else
          rows_dot<T, F>(wr, hr, (const float*)dr, sr, (const float*)mr, G, K, x_rows, dx_rows,
                         sx.data() + m * sx_row, Y + m * N + n, N);
      };
      int64_t m = m0;
      for (; m + 4 <= m1; m += 4) rows(std::integral_constant<int, 4>(), m);
      for (; m < m1; ++m) rows(std::integral_constant<int, 1>(), m);
    }
   }
  });
  return y;
}

at::Tensor q4q8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d,
                   const at::Tensor& mn, const at::Tensor& sup, int64_t act) {
  return blocks_mm<W4>(x, w, d, d, d, mn, act, sup);
}
// Q4_0 as the file holds it: codes q (w = (q − 8)·d), d float16; x rounded to Q8_0
at::Tensor q4s8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d) {
  return blocks_mm<W4S>(x, w, d, d, d, d, Q8_0);
}
// Q5_0 (signed, Q8_0 activations) when mn is empty, else w = q·d + mn (Q5_1, Q5_K)
at::Tensor q5q8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& qh, const at::Tensor& d,
                   const at::Tensor& mn, const at::Tensor& sup, int64_t act) {
  return mn.numel() ? blocks_mm<W5M>(x, w, qh, d, d, mn, act, sup) : blocks_mm<W5>(x, w, qh, d, d, d, Q8_0);
}
at::Tensor q8q8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d) {
  return blocks_mm<W8>(x, w, d, d, d, d, Q8_0);
}
at::Tensor q6q8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& qh, const at::Tensor& sc,
                   const at::Tensor& d) {
  return blocks_mm<W6K>(x, w, qh, d, sc, d, Q8_K);
}
at::Tensor q3q8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& qh, const at::Tensor& sc,
                   const at::Tensor& d) {
  return blocks_mm<W3K>(x, w, qh, d, sc, d, Q8_K);
}
at::Tensor q2q8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sc, const at::Tensor& d,
                   const at::Tensor& dmin) {
  return blocks_mm<W2K>(x, w, d, d, sc, dmin, Q8_K);
}

}  // namespace

TORCH_LIBRARY(localchat, m) {
  m.def("q4q8_mm(Tensor x, Tensor w, Tensor d, Tensor mn, Tensor sup, int act) -> Tensor");
  m.def("q4s8_mm(Tensor x, Tensor w, Tensor d) -> Tensor");
  m.def("q5q8_mm(Tensor x, Tensor w, Tensor qh, Tensor d, Tensor mn, Tensor sup, int act) -> Tensor");
  m.def("q8q8_mm(Tensor x, Tensor w, Tensor d) -> Tensor");
  m.def("q6q8_mm(Tensor x, Tensor w, Tensor qh, Tensor sc, Tensor d) -> Tensor");
  m.def("q3q8_mm(Tensor x, Tensor w, Tensor qh, Tensor sc, Tensor d) -> Tensor");
  m.def("q2q8_mm(Tensor x, Tensor w, Tensor sc, Tensor d, Tensor dmin) -> Tensor");
}
TORCH_LIBRARY_IMPL(localchat, CPU, m) {
  m.impl("q4q8_mm", &q4q8_mm);
  m.impl("q4s8_mm", &q4s8_mm);
  m.impl("q5q8_mm", &q5q8_mm);
  m.impl("q8q8_mm", &q8q8_mm);
  m.impl("q6q8_mm", &q6q8_mm);
  m.impl("q3q8_mm", &q3q8_mm);
  m.impl("q2q8_mm", &q2q8_mm);
}
