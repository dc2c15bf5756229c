// The 8-row interleaved Q4_0, Q4_1 and Q4_K tiles (q4x8.cpp's ops), as ggml's repacked
// GEMM/GEMV (repack.cpp) work: one activation load and one scale multiply serve a vector of
// weight rows, and each output lane is one weight row, so no horizontal sums. Written against
// x8_vec.cpp and compiled once per target (AVX2: 8 rows, AVX-512 VNNI: 16).

// Codes of 8 weight rows for one 32-block, 128 bytes: [chunk c 0..3][row r 0..7][byte k 0..3],
// byte k of chunk c holding weights 4c + k (low nibble) and 16 + 4c + k (high nibble).
constexpr int64_t X8_BLOCK = 128;

// Per activation row j < T: lane r = Σ over the block of q[r]·x[j] (AVX2: as int16 pairs,
// exact: |code · x| ≤ 15 · 127, eight pairs a lane at most 30480). x: row j at x + j·K.
template <int T>
inline void block_sums(const uint8_t* ca, const uint8_t* cb, const int8_t* x, int64_t K, vi* s) {
  const vi nibble = set1_i8(0x0F);
  for (int j = 0; j < T; ++j) s[j] = zero_i();
  for (int c = 0; c < 4; ++c) {
    const vi w = load_rows(ca + 32 * c, cb + 32 * c);
    const vi lo = and_i(w, nibble), hi = and_i(srli16(w, 4), nibble);
    for (int j = 0; j < T; ++j) {
      const int8_t* xj = x + j * K + 4 * c;
      s[j] = dot(s[j], lo, set1_i32(load_4_bytes(xj)));
      s[j] = dot(s[j], hi, set1_i32(load_4_bytes(xj + 16)));
    }
  }
}

// T activation rows against Q4_0 weight rows: per block the exact Σ (q − 8)·x (llama.cpp's
// integer), times d (the rows' float16 scales) · dx, summed over the blocks in order.
template <int T>
inline void tile_q4_0(const uint8_t* ca, const uint8_t* cb, const uint16_t* da, const uint16_t* db,
                      int64_t G, int64_t K, const int8_t* xq, const float* dx, const int32_t* bsum,
                      vf* out) {
  for (int j = 0; j < T; ++j) out[j] = zero_f();
  for (int64_t g = 0; g < G; ++g) {
    vi s[T];
    block_sums<T>(ca + g * X8_BLOCK, cb + g * X8_BLOCK, xq + g * 32, K, s);
    const vf dw = load_f16(da + g * 8, db + g * 8);
    for (int j = 0; j < T; ++j) {
      const vi isum = sub32(sum_i32(s[j]), set1_i32(8 * bsum[j * G + g]));
      out[j] = fmadd_f(to_f(isum), mul_f(dw, set1_f(dx[j * G + g])), out[j]);
    }
  }
}

// T activation rows against Q4_1 weight rows, as llama.cpp's Q4_1 dot: per block the exact
// Σ q·x times d · dx, plus the offset m times sx (Q8_1's fp16 dx·Σ codes), each summed over
// the blocks in order in its own accumulator. dm: per block the 8 rows' float16 d, then m.
template <int T>
inline void tile_q4_1(const uint8_t* ca, const uint8_t* cb, const uint16_t* dma, const uint16_t* dmb,
                      int64_t G, int64_t K, const int8_t* xq, const float* dx, const float* sx,
                      vf* out) {
  vf offsets[T];
  for (int j = 0; j < T; ++j) out[j] = offsets[j] = zero_f();
  for (int64_t g = 0; g < G; ++g) {
    vi s[T];
    block_sums<T>(ca + g * X8_BLOCK, cb + g * X8_BLOCK, xq + g * 32, K, s);
    const vf dw = load_f16(dma + g * 16, dmb + g * 16);
    const vf mw = load_f16(dma + g * 16 + 8, dmb + g * 16 + 8);
    for (int j = 0; j < T; ++j) {
      out[j] = fmadd_f(to_f(sum_i32(s[j])), mul_f(dw, set1_f(dx[j * G + g])), out[j]);
      offsets[j] = fmadd_f(mw, set1_f(sx[j * G + g]), offsets[j]);
    }
  }
  for (int j = 0; j < T; ++j) out[j] = add_f(out[j], offsets[j]);
}

// One tile's Q4_K parts
struct Q4KTile {
  const uint8_t *codes, *sc, *mn;
  const float* sup;
};

// T activation rows against Q4_K weight rows, as llama.cpp's Q4_K dot: per 256 weights the
// 32s' integer sums times their 6-bit scales summed as integers, times d · dx; the offsets
// Σ m · Σ codes likewise, times dmin · dx; out = the first minus the second. sc: [G][8 rows];
// mn: [G/2][8 rows][2 groups]; sup: [G/8][d of 8 rows, dmin of 8 rows]; bsum16: Σ codes per 32.
template <int T>
inline void tile_q4_k(const Q4KTile& a, const Q4KTile& b_, int64_t G, int64_t K, const int8_t* xq,
                      const float* dx, const int16_t* bsum16, vf* out) {
  vf acc[T], offsets[T];
  for (int j = 0; j < T; ++j) acc[j] = offsets[j] = zero_f();
  for (int64_t b = 0; b < G / 8; ++b) {
    vi isum[T];
    for (int j = 0; j < T; ++j) isum[j] = zero_i();
    for (int64_t g = 8 * b; g < 8 * b + 8; ++g) {
      vi s[T];
      block_sums<T>(a.codes + g * X8_BLOCK, b_.codes + g * X8_BLOCK, xq + g * 32, K, s);
      const vi scv = scale_from_i32(u8_to_i32(a.sc + g * 8, b_.sc + g * 8));
      for (int j = 0; j < T; ++j) isum[j] = add32(isum[j], scaled(s[j], scv));
    }
    vi m16[4];  // groups 2p, 2p + 1's mins as int16 pairs, lane r for row r
    for (int p = 0; p < 4; ++p)
      m16[p] = u8_to_i16(a.mn + (4 * b + p) * 16, b_.mn + (4 * b + p) * 16);
    const vf d8 = load_f32(a.sup + 16 * b, b_.sup + 16 * b);
    const vf dmin8 = load_f32(a.sup + 16 * b + 8, b_.sup + 16 * b + 8);
    for (int j = 0; j < T; ++j) {
      vi msum = zero_i();
      for (int p = 0; p < 4; ++p)
        msum = add32(msum, madd16(m16[p], set1_i32(load_4_bytes(bsum16 + j * G + 8 * b + 2 * p))));
      const vf dxb = set1_f(dx[j * G + 8 * b]);
      acc[j] = fmadd_f(to_f(isum[j]), mul_f(d8, dxb), acc[j]);
      offsets[j] = fmadd_f(to_f(msum), mul_f(dmin8, dxb), offsets[j]);
    }
  }
  for (int j = 0; j < T; ++j) out[j] = sub_f(acc[j], offsets[j]);
}

// The ops' bodies on this target: y [M, n] from activations rounded by the caller
at::Tensor mm_q4_0(int64_t M, int64_t n, const at::TensorOptions& options, const uint8_t* C,
                   const uint16_t* D, int64_t G, int64_t K, const int8_t* xq, const float* dx,
                   const int32_t* bsum) {
  return x8_mm(M, n, options, [&](auto rows, int64_t m, int64_t a, int64_t b, vf* out) {
    constexpr int T = decltype(rows)::value;
    tile_q4_0<T>(C + a * G * X8_BLOCK, C + b * G * X8_BLOCK, D + a * G * 8, D + b * G * 8, G, K,
                 xq + m * K, dx + m * G, bsum + m * G, out);
  });
}

at::Tensor mm_q4_1(int64_t M, int64_t n, const at::TensorOptions& options, const uint8_t* C,
                   const uint16_t* DM, int64_t G, int64_t K, const int8_t* xq, const float* dx,
                   const float* sx) {
  return x8_mm(M, n, options, [&](auto rows, int64_t m, int64_t a, int64_t b, vf* out) {
    constexpr int T = decltype(rows)::value;
    tile_q4_1<T>(C + a * G * X8_BLOCK, C + b * G * X8_BLOCK, DM + a * G * 16, DM + b * G * 16, G,
                 K, xq + m * K, dx + m * G, sx + m * G, out);
  });
}

at::Tensor mm_q4_k(int64_t M, int64_t n, const at::TensorOptions& options, const uint8_t* C,
                   const uint8_t* SC, const uint8_t* MN, const float* SUP, int64_t G, int64_t K,
                   const int8_t* xq, const float* dx, const int16_t* bsum16) {
  auto tile_at = [&](int64_t t) {
    return Q4KTile{C + t * G * X8_BLOCK, SC + t * G * 8, MN + t * G * 8, SUP + t * G * 2};
  };
  return x8_mm(M, n, options, [&](auto rows, int64_t m, int64_t a, int64_t b, vf* out) {
    constexpr int T = decltype(rows)::value;
    tile_q4_k<T>(tile_at(a), tile_at(b), G, K, xq + m * K, dx + m * G, bsum16 + m * G, out);
  });
}
