// The vector layer of the 8-row interleaved kernels (q4x8_tiles.cpp, q6x8_tiles.cpp), and their
// driver x8_mm. q4q8.py compiles these files once per target, each time in its own namespace:
// X8_WIDE 0 is AVX2 (a vector is one 8-row tile: 8 lanes of 32 bits, int8 products summed by
// vpmaddubsw into int16 pairs); X8_WIDE 1 is AVX-512 VNNI (a vector is two tiles side by side,
// 16 lanes, products summed by vpdpbusd straight into int32). Every integer sum is exact on
// both, so the two targets return the same bits, and a row the same bits alone as in a batch.

#if X8_WIDE
#define X8_OP(name) _mm512_##name          // an element-wise intrinsic at this width
#define X8_SI(name) _mm512_##name##_si512  // one on the whole register
constexpr int LANES = 16;  // weight rows a vector holds: tiles a and b
using vi = __m512i;
using vf = __m512;

// 32 bytes of tile a and 32 of tile b
inline vi load_rows(const void* a, const void* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                            _mm256_loadu_si256((const __m256i*)b), 1);
}
// 16 bytes of each tile
inline __m256i load_halves(const void* a, const void* b) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)a)),
                                 _mm_loadu_si128((const __m128i*)b), 1);
}
inline vf load_f32(const float* a, const float* b) {  // 8 floats of each tile
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}
inline vf load_f16(const uint16_t* a, const uint16_t* b) { return _mm512_cvtph_ps(load_halves(a, b)); }
inline vi u8_to_i32(const uint8_t* a, const uint8_t* b) {  // 8 bytes of each tile
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)a),
                                                 _mm_loadl_epi64((const __m128i*)b)));
}
inline vi u8_to_i16(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepu8_epi16(load_halves(a, b)); }
inline vi i8_to_i16(const int8_t* a, const int8_t* b) { return _mm512_cvtepi8_epi16(load_halves(a, b)); }

// A sum of unsigned-code × int8 products per lane: here int32
inline vi dot(vi acc, vi codes, vi x) { return _mm512_dpbusd_epi32(acc, codes, x); }
inline vi sum_i32(vi acc) { return acc; }
// A per-lane integer scale as `scaled` takes it: from int32 scales (0..2^15), or from int16
// pairs (a, b) per lane as the low (a) or high (b) one
inline vi scale_from_i32(vi s) { return s; }
inline vi scale_low16(vi pairs) { return _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16); }
inline vi scale_high16(vi pairs) { return _mm512_srai_epi32(pairs, 16); }
inline vi scaled(vi acc, vi scale) { return _mm512_mullo_epi32(acc, scale); }  // Σ · scale, int32
#else
#define X8_OP(name) _mm256_##name
#define X8_SI(name) _mm256_##name##_si256
constexpr int LANES = 8;  // weight rows a vector holds: tile a (b is not read)
using vi = __m256i;
using vf = __m256;

inline vi load_rows(const void* a, const void*) { return _mm256_loadu_si256((const __m256i*)a); }
inline vf load_f32(const float* a, const float*) { return _mm256_loadu_ps(a); }
inline vf load_f16(const uint16_t* a, const uint16_t*) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)a));
}
inline vi u8_to_i32(const uint8_t* a, const uint8_t*) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)a));
}
inline vi u8_to_i16(const uint8_t* a, const uint8_t*) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)a));
}
inline vi i8_to_i16(const int8_t* a, const int8_t*) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)a));
}

// A sum of unsigned-code × int8 products per lane: here int16 pairs (exact while a lane sums
// at most 32767: each caller says why it does)
inline vi dot(vi acc, vi codes, vi x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(codes, x)); }
inline vi sum_i32(vi acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
inline vi scale_from_i32(vi s) { return _mm256_or_si256(s, _mm256_slli_epi32(s, 16)); }
inline vi scale_low16(vi pairs) {
  const __m256i dup = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                       0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  return _mm256_shuffle_epi8(pairs, dup);
}
inline vi scale_high16(vi pairs) {
  const __m256i dup = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                                       2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  return _mm256_shuffle_epi8(pairs, dup);
}
inline vi scaled(vi acc, vi scale) { return _mm256_madd_epi16(acc, scale); }  // Σ · scale, int32
#endif

// The element-wise operations, the same at both widths
inline vi set1_i8(char v) { return X8_OP(set1_epi8)(v); }
inline vi set1_i32(int32_t v) { return X8_OP(set1_epi32)(v); }
inline vf set1_f(float v) { return X8_OP(set1_ps)(v); }
inline vi zero_i() { return X8_SI(setzero)(); }
inline vf zero_f() { return X8_OP(setzero_ps)(); }
inline vi and_i(vi a, vi b) { return X8_SI(and)(a, b); }
inline vi or_i(vi a, vi b) { return X8_SI(or)(a, b); }
inline vi srli16(vi a, int n) { return X8_OP(srli_epi16)(a, n); }
inline vi slli32(vi a, int n) { return X8_OP(slli_epi32)(a, n); }
inline vi add32(vi a, vi b) { return X8_OP(add_epi32)(a, b); }
inline vi sub32(vi a, vi b) { return X8_OP(sub_epi32)(a, b); }
inline vi madd16(vi a, vi b) { return X8_OP(madd_epi16)(a, b); }
inline vf to_f(vi a) { return X8_OP(cvtepi32_ps)(a); }
inline vf mul_f(vf a, vf b) { return X8_OP(mul_ps)(a, b); }
inline vf add_f(vf a, vf b) { return X8_OP(add_ps)(a, b); }
inline vf sub_f(vf a, vf b) { return X8_OP(sub_ps)(a, b); }
inline vf fmadd_f(vf a, vf b, vf c) { return X8_OP(fmadd_ps)(a, b, c); }
inline void store_f(float* p, vf v) { X8_OP(storeu_ps)(p, v); }
#undef X8_OP
#undef X8_SI

constexpr int TILES = LANES / 8;  // 8-row tiles a vector holds

inline int32_t load_4_bytes(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// y [M, N] from x [M, K] and N weight rows in tiles of 8 (the last one padded): `tile(T, m,
// a, b, out)` computes rows m .. m + T − 1 against tiles a and b (b = a where a is the last;
// AVX2 reads only a). Tiles are shared among threads; a thread's activations go in blocks of
// 64 rows, each used by all its tiles while in L2.
template <class Tile>
at::Tensor x8_mm(int64_t M, int64_t N, const at::TensorOptions& options, const Tile& tile) {
  at::Tensor y = at::empty({M, N}, options);
  float* Y = y.data_ptr<float>();
  const int64_t tiles = (N + 7) / 8, groups = (tiles + TILES - 1) / TILES, m_block = 64;
  at::parallel_for(0, groups, 2 / TILES, [&](int64_t g0, int64_t g1) {
    for (int64_t m0 = 0; m0 < M; m0 += m_block) {
      const int64_t m1 = std::min(M, m0 + m_block);
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t a = g * TILES, b = std::min(a + TILES - 1, tiles - 1);
        const int64_t cols = std::min<int64_t>(LANES, N - 8 * a);
        auto put = [&](int T, int64_t m, const vf* out) {
          for (int j = 0; j < T; ++j) {
            float* yr = Y + (m + j) * N + 8 * a;
            if (cols == LANES) {
              store_f(yr, out[j]);
            } else {
              float lanes[LANES];
              store_f(lanes, out[j]);
              std::memcpy(yr, lanes, cols * sizeof(float));
            }
          }
        };
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) {
          vf out[4];
          tile(std::integral_constant<int, 4>(), m, a, b, out);
          put(4, m, out);
        }
        for (; m < m1; ++m) {
          vf out[1];
          tile(std::integral_constant<int, 1>(), m, a, b, out);
          put(1, m, out);
        }
      }
    }
  });
  return y;
}
