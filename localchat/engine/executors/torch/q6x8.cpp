// localchat's 8-row interleaved Q6_K op (q6x8.py: Q6Kx8Linear): activations rounded to Q8_K
// (q4q8.cpp's quantize_rows), then q6x8_tiles.cpp's tile on this CPU's target: AVX-512 VNNI
// where has_vnni(), else AVX2 (the same bits). Compiled after q4q8.cpp and the targets.
namespace {

using x8_avx2::Q6X8_BLOCK;  // the same on both targets

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
  return (has_vnni() ? x8_avx512::mm_q6_k : x8_avx2::mm_q6_k)(
      M, n, x.options(), B, SC, D, G, K, xq.data(), dx.data(), bsum16.data());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(localchat, m) {
  m.def("q6kx8_mm(Tensor x, Tensor blocks, Tensor sc, Tensor d, int n) -> Tensor");
}
TORCH_LIBRARY_IMPL(localchat, CPU, m) {
  m.impl("q6kx8_mm", &q6kx8_mm);
}
