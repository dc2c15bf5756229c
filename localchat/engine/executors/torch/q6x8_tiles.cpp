// The 8-row interleaved Q6_K tile (q6x8.cpp's op), as q4x8_tiles.cpp's Q4_K: one activation
// load and one scale multiply serve a vector of weight rows, each output lane one weight row.
// Written against x8_vec.cpp and compiled once per target (AVX2: 8 rows, AVX-512 VNNI: 16).

// Per 32-block of 8 rows, 192 bytes: chunks c 0..3 of 32 bytes [row r 0..7][byte k 0..3],
// byte k holding weight 4c + k's code q + 32 (bits 0..5) and weight 16 + 4c + k's top 2 bits
// (bits 6..7); then chunk pairs p 0..1 of 32 bytes [row][byte k], byte k holding the low 4
// bits of weights 16 + 8p + k (low nibble) and 20 + 8p + k (high nibble).
constexpr int64_t Q6X8_BLOCK = 192;

// Chunk c's codes q + 32 (0..63) of the block's two halves: weights 4c + k (lo) and
// 16 + 4c + k (hi) of each row; pair: chunk pair c / 2's low nibbles of the hi half
template <int C>
inline void chunk_codes(const uint8_t* ba, const uint8_t* bb, vi pair, vi* lo, vi* hi) {
  const vi nibble = set1_i8(0x0F);
  const vi b = load_rows(ba + 32 * C, bb + 32 * C);
  *lo = and_i(b, set1_i8(0x3F));
  const vi low = C % 2 ? and_i(srli16(pair, 4), nibble) : and_i(pair, nibble);
  *hi = or_i(low, and_i(srli16(b, 2), set1_i8(0x30)));
}

// Chunks C, C + 1 of one block for T activation rows: Σ (q + 32)·x per half (AVX2: as int16
// pairs, at most 4 products of 63 · 127: exact), times each row's sub-scale of the half, into isum
template <int C, int T>
inline void chunk_pair(const uint8_t* ba, const uint8_t* bb, vi sc_lo, vi sc_hi, const int8_t* x,
                       int64_t K, vi* isum) {
  const vi pair = load_rows(ba + 128 + 16 * C, bb + 128 + 16 * C);  // pair C / 2
  vi lo0, hi0, lo1, hi1;
  chunk_codes<C>(ba, bb, pair, &lo0, &hi0);
  chunk_codes<C + 1>(ba, bb, pair, &lo1, &hi1);
  for (int j = 0; j < T; ++j) {
    const int8_t* xj = x + j * K + 4 * C;
    const vi a = dot(dot(zero_i(), lo0, set1_i32(load_4_bytes(xj))), lo1, set1_i32(load_4_bytes(xj + 4)));
    const vi b = dot(dot(zero_i(), hi0, set1_i32(load_4_bytes(xj + 16))), hi1,
                     set1_i32(load_4_bytes(xj + 20)));
    isum[j] = add32(isum[j], add32(scaled(a, sc_lo), scaled(b, sc_hi)));
  }
}

// T activation rows against Q6_K weight rows, as llama.cpp's Q6_K dot: per 256 weights the
// 16s' integer sums Σ (q − 32)·x times their int8 scales summed as integers (here Σ sc·Σ
// (q + 32)·x − 32·Σ sc·Σ x), times d · dx, summed over the 256s in order. sc: [G][8 rows][2
// halves]; d: [G/8][8 rows]; bsum16: Σ codes per 16 activations.
template <int T>
inline void tile_q6_k(const uint8_t* ba, const uint8_t* bb, const int8_t* sca, const int8_t* scb,
                      const float* da, const float* db, int64_t G, int64_t K, const int8_t* xq,
                      const float* dx, const int16_t* bsum16, vf* out) {
  for (int j = 0; j < T; ++j) out[j] = zero_f();
  for (int64_t b = 0; b < G / 8; ++b) {
    vi isum[T], offset[T];
    for (int j = 0; j < T; ++j) isum[j] = offset[j] = zero_i();
    for (int64_t g = 8 * b; g < 8 * b + 8; ++g) {
      const uint8_t *blocka = ba + g * Q6X8_BLOCK, *blockb = bb + g * Q6X8_BLOCK;
      const vi pairs = i8_to_i16(sca + g * 16, scb + g * 16);  // (sc of half 0, of half 1) a row
      const vi sc_lo = scale_low16(pairs), sc_hi = scale_high16(pairs);
      const int8_t* x = xq + g * 32;
      chunk_pair<0, T>(blocka, blockb, sc_lo, sc_hi, x, K, isum);
      chunk_pair<2, T>(blocka, blockb, sc_lo, sc_hi, x, K, isum);
      for (int j = 0; j < T; ++j)  // Σ over the two halves of sc · Σ x
        offset[j] = add32(offset[j], madd16(pairs, set1_i32(load_4_bytes(bsum16 + j * 2 * G + 2 * g))));
    }
    const vf d8 = load_f32(da + 8 * b, db + 8 * b);
    for (int j = 0; j < T; ++j) {
      const vi total = sub32(isum[j], slli32(offset[j], 5));
      out[j] = fmadd_f(to_f(total), mul_f(d8, set1_f(dx[j * G + 8 * b])), out[j]);
    }
  }
}

// The op's body on this target: y [M, n] from activations rounded by the caller
at::Tensor mm_q6_k(int64_t M, int64_t n, const at::TensorOptions& options, const uint8_t* B,
                   const int8_t* SC, const float* D, int64_t G, int64_t K, const int8_t* xq,
                   const float* dx, const int16_t* bsum16) {
  return x8_mm(M, n, options, [&](auto rows, int64_t m, int64_t a, int64_t b, vf* out) {
    constexpr int T = decltype(rows)::value;
    tile_q6_k<T>(B + a * G * Q6X8_BLOCK, B + b * G * Q6X8_BLOCK, SC + a * G * 16, SC + b * G * 16,
                 D + a * G, D + b * G, G, K, xq + m * K, dx + m * G, bsum16 + m * 2 * G, out);
  });
}
