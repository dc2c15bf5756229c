// localchat's 8-row interleaved Q4_0, Q4_1 and Q4_K ops (q4x8.py: Q4S8x8Linear, Q41x8Linear,
// Q4Kx8Linear): activations rounded as llama.cpp rounds them (q4q8.cpp's quantize_rows), then
// the tiles of q4x8_tiles.cpp on this CPU's target: AVX-512 VNNI where has_vnni(), else AVX2.
// Both return the same bits. Compiled after q4q8.cpp and the targets in one translation unit.
namespace {

using x8_avx2::X8_BLOCK;  // the same on both targets

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
  return (has_vnni() ? x8_avx512::mm_q4_0 : x8_avx2::mm_q4_0)(
      M, n, a.x.options(), C, D, G, K, xq.data(), a.dx.data(), bsum.data());
}

// Q4_1 repacked: codes as q4s8x8's, dm float16 [N8/8, G, 2, 8] (d, m); x rounded to Q8_1
at::Tensor q41x8_mm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& dm, int64_t n) {
  Rounded a(x_in, Q8_1);
  const int64_t K = a.K, G = a.G;
  TORCH_CHECK(codes.numel() == (n + 7) / 8 * G * X8_BLOCK && dm.numel() == (n + 7) / 8 * G * 16 &&
              dm.scalar_type() == at::kHalf, "q41x8: shapes");
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const uint16_t* DM = (const uint16_t*)dm.data_ptr();
  return (has_vnni() ? x8_avx512::mm_q4_1 : x8_avx2::mm_q4_1)(
      a.M, n, a.x.options(), C, DM, G, K, a.xq.data(), a.dx.data(), a.sx.data());
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
  return (has_vnni() ? x8_avx512::mm_q4_k : x8_avx2::mm_q4_k)(
      M, n, a.x.options(), codes.data_ptr<uint8_t>(), sc.data_ptr<uint8_t>(), mn.data_ptr<uint8_t>(),
      sup.data_ptr<float>(), G, K, xq.data(), a.dx.data(), bsum.data());
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
