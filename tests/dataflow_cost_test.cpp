// The analytical cost formulas against closed forms worked by hand (SCALE-Sim's systolic formula,
// bandwidth arithmetic, HARDWARE.md's measured figures).
#include <gtest/gtest.h>

#include "tessel/support/error.h"
#include "tessel/targets/dataflow/cost.h"

using namespace tessel;
using namespace tessel::dataflow;

namespace {

// A core with `count` plain S x S weight-stationary arrays (1 MAC per PE per cycle), SCALE-Sim's
// fill 2S - 1 and drain S - 1.
HwSpec systolic(int64_t S, int64_t count = 1, int64_t pass_rows = 1) {
  HwSpec hw = load_preset("tpu-v5e");
  hw.matrix.rows = hw.matrix.cols = S;
  hw.matrix.count = count;
  hw.matrix.macs_per_cycle = double(S * S * count);
  hw.matrix.fill_cycles = double(2 * S - 1);
  hw.matrix.drain_cycles = double(S - 1);
  hw.matrix.pass_rows = pass_rows;
  return hw;
}

// (2S + S + M - 2) * ceil(N/S) * ceil(K/S), written out independently of the code.
double scalesim(int64_t S, int64_t M, int64_t K, int64_t N) {
  return double(3 * S + M - 2) * double((N + S - 1) / S) * double((K + S - 1) / S);
}

}  // namespace

TEST(DataflowCost, WeightStationaryClosedForm) {
  struct Case { int64_t S, M, K, N; double cycles; };
  // cycles worked by hand: (3S + M - 2) * ceil(N/S) * ceil(K/S)
  const Case cases[] = {
      {128, 512, 256, 384, 894.0 * 3 * 2},  // multiples of S
      {128, 100, 130, 129, 482.0 * 2 * 2},  // K and N one past a multiple
      {8, 10, 17, 9, 32.0 * 2 * 3},         // small array
      {16, 1, 16, 16, 47.0},                // one row, one fold
      {4, 7, 3, 5, 17.0 * 2 * 1},
  };
  for (const Case& c : cases) {
    const HwSpec hw = systolic(c.S);
    EXPECT_DOUBLE_EQ(scalesim(c.S, c.M, c.K, c.N), c.cycles);
    EXPECT_DOUBLE_EQ(matmul_cycles(hw, c.M, c.K, c.N, DType::bf16, Orientation::as_given), c.cycles)
        << "S=" << c.S << " M=" << c.M << " K=" << c.K << " N=" << c.N;
    EXPECT_DOUBLE_EQ(systolic_ws_cycles(c.S, c.S, 2 * c.S - 1, c.S - 1, c.M, c.K, c.N), c.cycles);
  }
}

TEST(DataflowCost, BetterOrientationAndSeveralArrays) {
  const HwSpec one = systolic(128);
  // As given: (382 + 8) * 8 * 1 = 3120; swapped (N streams): (382 + 1000) * 1 * 1 = 1382.
  MatmulCost c = matmul_cost(one, 8, 128, 1000, DType::bf16);
  EXPECT_DOUBLE_EQ(c.cycles, 1382);
  EXPECT_TRUE(c.swapped);
  EXPECT_DOUBLE_EQ(matmul_cycles(one, 8, 128, 1000, DType::bf16, Orientation::as_given), 3120);
  // Four arrays share 6 folds: ceil(6/4) = 2 folds of 894 cycles.
  EXPECT_DOUBLE_EQ(matmul_cycles(systolic(128, 4), 512, 256, 384, DType::bf16, Orientation::as_given), 1788);
  // Passes of 8 rows: M = 10 streams as 16 rows: (15 + 16 + 7) * 2 * 3 = 228.
  EXPECT_DOUBLE_EQ(matmul_cycles(systolic(8, 1, 8), 10, 17, 9, DType::bf16, Orientation::as_given), 228);
  // The v5e preset is four 128x128 arrays: one [8,128]x[128,128] fold is 255 + 8 + 127 cycles.
  EXPECT_DOUBLE_EQ(matmul_cycles(load_preset("tpu-v5e"), 8, 128, 128, DType::bf16), 390);
}

TEST(DataflowCost, SpyreMatmulUsesSustainedRateAndSmallMDerate) {
  const HwSpec hw = load_preset("spyre");
  // 12 MACs per PE per cycle: a fold holds K = 8 * 12 = 96 by N = 8. [64,4096]x[4096,3200]:
  // ceil(4096/96) = 43, ceil(3200/8) = 400: 17200 folds, 8600 per array, 64 rows each = 550400 cycles
  // at peak, / (1140/1536) sustained.
  EXPECT_NEAR(matmul_cycles(hw, 64, 4096, 3200, DType::f16), 550400 / 0.7421875, 1e-6);
  // 8 rows = 1 pass of the 8 needed for full rate: efficiency sqrt(1/8). [8,96]x[96,16]: 2 folds, one
  // per array, 8 cycles.
  MatmulCost c = matmul_cost(hw, 8, 96, 16, DType::f16, Orientation::as_given);
  EXPECT_NEAR(c.efficiency, 0.7421875 * std::sqrt(1.0 / 8), 1e-12);
  EXPECT_NEAR(c.cycles, 8 / (0.7421875 * std::sqrt(1.0 / 8)), 1e-9);
  EXPECT_EQ(c.folds, 2);
  // Never faster than peak: MACs / 1536.
  for (int64_t m : {1, 7, 64, 100, 512})
    EXPECT_GE(matmul_cycles(hw, m, 4096, 640, DType::f16), double(m) * 4096 * 640 / 1536);
}

TEST(DataflowCost, OutputStationary) {
  HwSpec hw = systolic(8);
  hw.matrix.dataflow = Dataflow::output_stationary;
  hw.matrix.fill_cycles = 7;
  hw.matrix.drain_cycles = 7;
  // ceil(20/8) * ceil(9/8) = 6 output blocks, each streaming K = 30: 6 * (7 + 30 + 7) = 264.
  EXPECT_DOUBLE_EQ(matmul_cycles(hw, 20, 30, 9, DType::bf16, Orientation::as_given), 264);
}

TEST(DataflowCost, UnsupportedMatmulDtype) {
  try {
    matmul_cycles(load_preset("tpu-v5e"), 8, 8, 8, DType::f32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_unsupported());
    EXPECT_NE(std::string(e.what()).find("no rate for f32"), std::string::npos) << e.what();
  }
}

TEST(DataflowCost, VectorOps) {
  const HwSpec hw = load_preset("spyre");
  EXPECT_DOUBLE_EQ(vector_cycles(hw, VectorOp::add, 1000), 8 + 8);              // ceil(1000/128) = 8
  EXPECT_DOUBLE_EQ(vector_cycles(hw, VectorOp::transcendental, 1000), 8 + 63);  // ceil(1000/16) = 63
  EXPECT_DOUBLE_EQ(vector_cycles(hw, VectorOp::reduce, 64), 8 + 1);
  EXPECT_DOUBLE_EQ(vector_cycles(hw, VectorOp::mul, 0), 0);
}

TEST(DataflowCost, DmaTime) {
  const HwSpec hw = load_preset("spyre");  // 150 GB/s at 1 GHz = 150 B/cycle, latency 300
  EXPECT_DOUBLE_EQ(dma_cycles(hw, 1 << 20, DmaDir::read), 300 + 1048576.0 / 150);
  EXPECT_DOUBLE_EQ(dma_cycles(hw, 1 << 20, DmaDir::read, 2), 300 + 2 * 1048576.0 / 150);
  EXPECT_DOUBLE_EQ(dma_cycles(hw, 1 << 20, DmaDir::write, 1, true), 300 + 1048576.0 / 105);
  const HwSpec v5e = load_preset("tpu-v5e");  // 819 GB/s at 1.5 GHz = 546 B/cycle
  EXPECT_DOUBLE_EQ(dma_cycles(v5e, 546000, DmaDir::read), 500 + 1000);
  EXPECT_DOUBLE_EQ(v5e.seconds(1500), 1e-6);
}

TEST(DataflowCost, RingHopsAndTransfers) {
  const HwSpec hw = load_preset("spyre");
  EXPECT_EQ(hops(hw, 0, 0), 0);
  EXPECT_EQ(hops(hw, 0, 1), 1);
  EXPECT_EQ(hops(hw, 0, 31), 1);   // the other way round the ring
  EXPECT_EQ(hops(hw, 0, 16), 16);
  EXPECT_EQ(hops(hw, 3, 20), 15);
  EXPECT_EQ(hops(hw, 20, 3), 15);
  // 4096 bytes over 3 hops: 3 * 4 cycles + 4096 / 128.
  EXPECT_DOUBLE_EQ(transfer_cycles(hw, 4096, 3), 12 + 32);
  EXPECT_DOUBLE_EQ(transfer_cycles(hw, 4096, 0), 0);
  HwSpec mesh = hw;
  mesh.interconnect.topology = Topology::mesh;
  mesh.interconnect.mesh_shape = {4, 8};
  EXPECT_EQ(hops(mesh, 0, 31), 3 + 7);
  EXPECT_EQ(hops(mesh, 9, 18), 1 + 1);
  // No interconnect (v4's two cores): a store and a load, 2 x (500 + 2286 / (1200 / 1.05)).
  const HwSpec v4 = load_preset("tpu-v4");
  EXPECT_EQ(hops(v4, 0, 1), -1);
  EXPECT_NEAR(transfer_cycles(v4, 2286, -1), 2 * (500 + 2286 * 1.05 / 1200), 1e-9);
}

TEST(DataflowCost, KSplitReduction) {
  const HwSpec hw = load_preset("spyre");
  // 1.4e-4 us per output element per hop at 1 GHz = 0.14 cycles; [64,3200] partial sums, K split 2:
  // one hop: 4 + 204800 * 0.14 = 28676 cycles (= 28.7 us, HARDWARE.md's figure x 204800).
  EXPECT_NEAR(reduce_cycles(hw, 204800, 2, 2), 28676, 1e-6);
  EXPECT_NEAR(reduce_cycles(hw, 204800, 4, 2), 3 * 28676, 1e-6);
  EXPECT_DOUBLE_EQ(reduce_cycles(hw, 204800, 1, 2), 0);
  // Without a measured figure the link rate decides: 4 bytes / 128 B per cycle per element.
  HwSpec plain = hw;
  plain.interconnect.reduce_cycles_per_element_hop = 0;
  EXPECT_NEAR(reduce_step_cycles(plain, 1024, 4, 2), 2 * (4 + 1024 * 4.0 / 128), 1e-9);
  // Through DRAM (v4): store 4000 B, load 4000 B (each 500 + 4000 * 1.05 / 1200), add 1000 elements
  // (4 + ceil(1000/1024)).
  const HwSpec v4 = load_preset("tpu-v4");
  EXPECT_NEAR(reduce_cycles(v4, 1000, 2, 4), 2 * (500 + 3.5) + 5, 1e-9);
}

TEST(DataflowCost, OverlapOverheadRoofline) {
  const HwSpec hw = load_preset("spyre");
  EXPECT_DOUBLE_EQ(overlap_cycles(hw, 100, 60), 100 + 60 - 0.46 * 60);
  EXPECT_DOUBLE_EQ(overlap_cycles(load_preset("tpu-v5e"), 100, 60), 100);
  EXPECT_DOUBLE_EQ(kernel_overhead_cycles(hw), 1500);
  // Granite-8B MLP prefill [1,512,4096] x [4096,12800] f16: 2*512*4096*12800 FLOP; A, B and C once
  // each in f16.
  const double flops = 2.0 * 512 * 4096 * 12800;
  const double bytes = 2.0 * (512 * 4096 + 4096 * 12800 + 512 * 12800);
  Roofline r = roofline(hw, flops, bytes, DType::f16);
  EXPECT_NEAR(r.compute_s, 53687091200.0 / 98.304e12, 1e-12);  // 546 us
  EXPECT_NEAR(r.memory_s, 122159104.0 / 150e9, 1e-12);         // 814 us
  EXPECT_DOUBLE_EQ(r.bound_s, r.memory_s);
  EXPECT_TRUE(r.memory_bound());
}

// Every dataflow against SCALE-Sim v2's cycle count for one R x C array with no memory stall
// (scalesim/compute/systolic_compute_{ws,os,is}.py: each fold of the array adds its demand matrix's rows,
// a partial fold padded to the whole array), written out here independently of the code:
//   ws: ceil(K/R) ceil(N/C) folds of 2R + C + M - 2   (weights K x N stay, M rows stream)
//   os: ceil(M/R) ceil(N/C) folds of K + R + C - 2    (an M x N block of outputs stays, K streams)
//   is: ceil(K/R) ceil(M/C) folds of 2R + C + N - 2   (inputs K x M stay, N columns stream)
// Fill and drain come from the array and the dataflow (derived_*_cycles), as a hardware file without
// fill_cycles / drain_cycles gets them. bench/scalesim_compare.py runs SCALE-Sim itself on these shapes.
TEST(DataflowCost, EveryDataflowMatchesScaleSimPerFold) {
  struct Gemm { int64_t M, K, N; };
  const Gemm gemms[] = {{64, 64, 64},     {128, 128, 128}, {256, 512, 128}, {512, 1024, 512}, {1, 768, 768},
                        {8, 128, 1000},   {100, 130, 129}, {33, 65, 97},    {1024, 64, 64},   {64, 1024, 64},
                        {64, 64, 1024},   {197, 768, 2304}, {49, 512, 512}, {3136, 64, 256},  {12, 4096, 1024},
                        {300, 300, 300}};
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const std::pair<int64_t, int64_t> arrays[] = {{32, 32}, {128, 128}, {32, 128}, {128, 32}};
  for (const auto& [R, C] : arrays) {
    for (Dataflow d : {Dataflow::weight_stationary, Dataflow::output_stationary, Dataflow::input_stationary}) {
      HwSpec hw = load_preset("tpu-v5e");
      hw.matrix.rows = R;
      hw.matrix.cols = C;
      hw.matrix.count = 1;
      hw.matrix.pass_rows = 1;
      hw.matrix.macs_per_cycle = double(R * C);
      hw.matrix.dataflow = d;
      hw.matrix.fill_cycles = derived_fill_cycles(R, C, d);
      hw.matrix.drain_cycles = derived_drain_cycles(R, C, d);
      for (const Gemm& g : gemms) {
        double want = 0;
        switch (d) {
          case Dataflow::weight_stationary: want = double(cdiv(g.K, R) * cdiv(g.N, C) * (2 * R + C + g.M - 2)); break;
          case Dataflow::output_stationary: want = double(cdiv(g.M, R) * cdiv(g.N, C) * (g.K + R + C - 2)); break;
          case Dataflow::input_stationary: want = double(cdiv(g.K, R) * cdiv(g.M, C) * (2 * R + C + g.N - 2)); break;
        }
        EXPECT_DOUBLE_EQ(matmul_cycles(hw, g.M, g.K, g.N, DType::bf16, Orientation::as_given), want)
            << dataflow_name(d) << " " << R << "x" << C << " M=" << g.M << " K=" << g.K << " N=" << g.N;
      }
    }
  }
}

// A hardware file without fill_cycles / drain_cycles gets them from its array and dataflow; one that
// gives them keeps them (spyre folds them into its measured rate: 0).
TEST(DataflowCost, FillAndDrainFollowFromTheArrayUnlessGiven) {
  const HwSpec v5e = load_preset("tpu-v5e");
  EXPECT_EQ(v5e.matrix.fill_cycles, 255);
  EXPECT_EQ(v5e.matrix.drain_cycles, 127);
  EXPECT_EQ(load_preset("spyre").matrix.fill_cycles, 0);
  EXPECT_EQ(derived_fill_cycles(32, 128, Dataflow::output_stationary), 31);
  EXPECT_EQ(derived_drain_cycles(32, 128, Dataflow::output_stationary), 127);
  EXPECT_EQ(derived_fill_cycles(32, 128, Dataflow::input_stationary), 63);
}
