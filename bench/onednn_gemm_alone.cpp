// Each matmul of the tblock_bert training step (1x128x768, d=768, MLP 3072) run alone through oneDNN, on
// warm operands, 20 times after 3 warm-up calls: the rate oneDNN reaches on these shapes at best, beside
// the step's matmul floor (TrainStep.matmul_floor runs them back to back, as the step does). Standalone:
//   g++ -O2 bench/onednn_gemm_alone.cpp -o /tmp/gemm_alone -ldnnl && OMP_NUM_THREADS=2 /tmp/gemm_alone
// (docs/BENCHMARKS.md, "Fourteenth session"). Plain row-major operands; the transposed layouts measured
// within a few per cent of these.
#include <chrono>
#include <cstdio>
#include <dnnl.hpp>

int main() {
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  struct Shape { int m, k, n; const char* what; };
  const Shape shapes[] = {
      {128, 768, 2304, "fwd qkv"},       {128, 768, 768, "fwd proj"},      {128, 768, 3072, "fwd fc1"},
      {128, 3072, 768, "fwd fc2"},       {128, 2304, 768, "bwd qkv dX"},   {768, 128, 2304, "bwd qkv dW"},
      {128, 768, 768, "bwd proj dX"},    {768, 128, 768, "bwd proj dW"},   {128, 3072, 768, "bwd fc1 dX"},
      {768, 128, 3072, "bwd fc1 dW"},    {128, 768, 3072, "bwd fc2 dX"},   {3072, 128, 768, "bwd fc2 dW"},
  };
  double total_ms = 0, total_flop = 0;
  for (const Shape& sh : shapes) {
    const memory::desc a({sh.m, sh.k}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc b({sh.k, sh.n}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc c({sh.m, sh.n}, memory::data_type::f32, memory::format_tag::ab);
    const matmul::primitive_desc pd(matmul::desc(a, b, c), eng);
    const matmul mm(pd);
    memory A(a, eng), B(b, eng), C(c, eng);
    auto* pa = static_cast<float*>(A.get_data_handle());
    auto* pb = static_cast<float*>(B.get_data_handle());
    for (long i = 0; i < static_cast<long>(sh.m) * sh.k; ++i) pa[i] = 1e-3f * static_cast<float>(i % 7);
    for (long i = 0; i < static_cast<long>(sh.k) * sh.n; ++i) pb[i] = 1e-3f * static_cast<float>(i % 5);
    const auto run = [&] { mm.execute(s, {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, C}}); };
    for (int i = 0; i < 3; ++i) run();
    s.wait();
    const int reps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) run();
    s.wait();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    const double flop = 2.0 * sh.m * sh.k * sh.n;
    total_ms += ms;
    total_flop += flop;
    std::printf("%-12s [%dx%d]·[%dx%d]  %6.3f ms  %4.0f GFLOP/s  %s\n", sh.what, sh.m, sh.k, sh.k, sh.n, ms,
                flop / ms / 1e6, pd.impl_info_str());
  }
  std::printf("sum of the linear layers' 12 matmuls (forward, dX, dW; attention's small ones not included): %.2f ms, %.2f GFLOP, %.0f GFLOP/s\n",
              total_ms, total_flop / 1e9, total_flop / total_ms / 1e6);
}
