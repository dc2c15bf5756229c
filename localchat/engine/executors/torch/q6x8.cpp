// localchat's 8-row interleaved Q6_K op (q6x8.py: Q6Kx8Linear), as q4x8.cpp's Q4_K: one
// activation load and one scale multiply serve 8 weight rows, each output lane one weight row.
// Compiled after q4q8.cpp and q4x8.cpp in the same translation unit (it uses quantize_rows,
// load_4_bytes and x8_mm). Every activation row runs the same arithmetic in the same order
// whether it sits in a 4-row tile or alone, so a row gets the same bits alone as in a batch.
namespace {

// Per 32-block of 8 rows, 192 bytes: chunks c 0..3 of 32 bytes [row r 0..7][byte k 0..3],
// byte k holding weight 4c + k's code q + 32 (bits 0..5) and weight 16 + 4c + k's top 2 bits
// (bits 6..7); then chunk pairs p 0..1 of 32 bytes [row][byte k], byte k holding the low 4
// bits of weights 16 + 8p + k (low nibble) and 20 + 8p + k (high nibble).
constexpr int64_t Q6X8_BLOCK = 192;

// Chunk c's codes q + 32 (0..63) of the block's two halves: weights 4c + k (lo) and
// 16 + 4c + k (hi) of each row; pair: chunk pair c / 2's low nibbles of the hi half
template <int C>
inline void chunk_codes(const uint8_t* block, __m256i pair, __m256i* lo, __m256i* hi) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i b = _mm256_loadu_si256((const __m256i*)(block + 32 * C));
  *lo = _mm256_and_si256(b, _mm256_set1_epi8(0x3F));
  const __m256i low = C % 2 ? _mm256_and_si256(_mm256_srli_epi16(pair, 4), nibble)
                            : _mm256_and_si256(pair, nibble);
  *hi = _mm256_or_si256(low, _mm256_and_si256(_mm256_srli_epi16(b, 2), _mm256_set1_epi8(0x30)));
}

// Chunks C, C + 1 of one block for T activation rows: Σ (q + 32)·x as int16 pairs per half
// (at most 4 products of 63 · 127: exact), times each row's sub-scale of the half, into isum
template <int C, int T>
inline void chunk_pair(const uint8_t* block, __m256i sc_lo, __m256i sc_hi, const int8_t* x,
                       int64_t K, __m256i* isum) {
  const __m256i pair = _mm256_loadu_si256((const __m256i*)(block + 128 + 16 * C));  // pair C / 2
  __m256i lo0, hi0, lo1, hi1;
  chunk_codes<C>(block, pair, &lo0, &hi0);
  chunk_codes<C + 1>(block, pair, &lo1, &hi1);
  for (int j = 0; j < T; ++j) {
    const int8_t* xj = x + j * K + 4 * C;
    const __m256i a = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo0, _mm256_set1_epi32(load_4_bytes(xj))),
        _mm256_maddubs_epi16(lo1, _mm256_set1_epi32(load_4_bytes(xj + 4))));
    const __m256i b = _mm256_add_epi16(
        _mm256_maddubs_epi16(hi0, _mm256_set1_epi32(load_4_bytes(xj + 16))),
        _mm256_maddubs_epi16(hi1, _mm256_set1_epi32(load_4_bytes(xj + 20))));
    isum[j] = _mm256_add_epi32(isum[j], _mm256_add_epi32(_mm256_madd_epi16(a, sc_lo),
                                                         _mm256_madd_epi16(b, sc_hi)));
  }
}

// T activation rows against 8 Q6_K weight rows, as llama.cpp's Q6_K dot: per 256 weights the
// 16s' integer sums Σ (q − 32)·x times their int8 scales summed as integers (here Σ sc·Σ
// (q + 32)·x − 32·Σ sc·Σ x), times d · dx, summed over the 256s in order. sc: [G][8 rows][2
// halves]; d: [G/8][8 rows]; bsum16: Σ codes per 16 activations.
template <int T>
inline void tile_q6_k(const uint8_t* blocks, const int8_t* sc, const float* d, int64_t G, int64_t K,
                      const int8_t* xq, const float* dx, const int16_t* bsum16, __m256* out) {
  // int16 pairs (sc of half 0, sc of half 1) per row → each half's sc in both int16s
  const __m256i dup_lo = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                          0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  const __m256i dup_hi = _mm256_add_epi8(dup_lo, _mm256_set1_epi8(2));
  for (int j = 0; j < T; ++j) out[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < G / 8; ++b) {
    __m256i isum[T], offset[T];
    for (int j = 0; j < T; ++j) isum[j] = offset[j] = _mm256_setzero_si256();
    for (int64_t g = 8 * b; g < 8 * b + 8; ++g) {
      const uint8_t* block = blocks + g * Q6X8_BLOCK;
      const __m256i pairs = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(sc + g * 16)));
      const __m256i sc_lo = _mm256_shuffle_epi8(pairs, dup_lo);
      const __m256i sc_hi = _mm256_shuffle_epi8(pairs, dup_hi);
      const int8_t* x = xq + g * 32;
      chunk_pair<0, T>(block, sc_lo, sc_hi, x, K, isum);
      chunk_pair<2, T>(block, sc_lo, sc_hi, x, K, isum);
      for (int j = 0; j < T; ++j)  // Σ over the two halves of sc · Σ x
        offset[j] = _mm256_add_epi32(offset[j], _mm256_madd_epi16(
            pairs, _mm256_set1_epi32(load_4_bytes(bsum16 + j * 2 * G + 2 * g))));
    }
    const __m256 d8 = _mm256_loadu_ps(d + 8 * b);
    for (int j = 0; j < T; ++j) {
      const __m256i total = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(offset[j], 5));
      out[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total),
                               _mm256_mul_ps(d8, _mm256_set1_ps(dx[j * G + 8 * b])), out[j]);
    }
  }
}

// Q6_K repacked: blocks [N8/8, G, Q6X8_BLOCK], sc int8 [N8/8, G, 8, 2], d float32
// [N8/8, G/8, 8]; x rounded to Q8_K; n: the rows wanted
at::Tensor q6kx8_mm(const at::Tensor& x_in, const at::Tensor& blocks, const at::Tensor& sc,
                    const at::Tensor& d, int64_t n) {
  const at::Tensor x = x_in.contiguous().to(at::kFloat);
  const int64_t M = x.size(0), K = x.size(1), G = K / 32, tiles = (n + 7) / 8;
  TORCH_CHECK(K % 256 == 0 && blocks.numel() == tiles * G * Q6X8_BLOCK &&
              sc.numel() == tiles * G * 16 && sc.scalar_type() == at::kChar &&
              d.numel() == tiles * G && d.scalar_type() == at::kFloat, "q6kx8: shapes");
  std::vector<int8_t> xq(M * K);
  std::vector<float> dx(M * G), sx(M * G);
  quantize_rows(x.data_ptr<float>(), M, K, Q8_K, xq.data(), dx.data(), sx.data());
  std::vector<int16_t> bsum16(M * 2 * G);  // |Σ| ≤ 16 · 127
  for (int64_t h = 0; h < M * 2 * G; ++h) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += xq[h * 16 + i];
    bsum16[h] = (int16_t)sum;
  }
  const uint8_t* B = blocks.data_ptr<uint8_t>();
  const int8_t* SC = sc.data_ptr<int8_t>();
  const float* D = d.data_ptr<float>();
  return x8_mm(M, n, x.options(), [&](auto rows, int64_t m, int64_t t, __m256* out) {
    constexpr int T = decltype(rows)::value;
    tile_q6_k<T>(B + t * G * Q6X8_BLOCK, SC + t * G * 16, D + t * G, G, K, xq.data() + m * K,
                 dx.data() + m * G, bsum16.data() + m * 2 * G, out);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(localchat, m) {
  m.def("q6kx8_mm(Tensor x, Tensor blocks, Tensor sc, Tensor d, int n) -> Tensor");
}
TORCH_LIBRARY_IMPL(localchat, CPU, m) {
  m.impl("q6kx8_mm", &q6kx8_mm);
}
