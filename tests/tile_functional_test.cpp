// The functional simulator of the tile level (docs/sim.md, "Functional simulation"): device-dtype
// rounding against the exact encoder, every corpus model run tile by tile in f16/bf16 storage with
// fp32 compute against the eager interpreter (and the model's reference outputs), and coverage
// errors for a deliberately broken split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <tuple>
#include <chrono>
#include <cmath>
#include <random>

#include "corpus_util.h"
#include "tessel/kernel/kernel.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/hw/hw.h"
#include "tessel/targets/dataflow/functional.h"
#include "tessel/targets/dataflow/map.h"
#include "tessel/tile/tile.h"

using namespace tessel;

namespace {

struct Prepared {
  KernelModule module;
  std::vector<Tensor> inputs, refs, eager;
};

// The eager interpreter on the imported model (the oracle), then the core pipeline and fusion.
Prepared prepare(const std::string& model) {
  testenv::CorpusCase c = testenv::load_corpus_model(model);
  Prepared p;
  p.inputs = c.inputs;
  p.refs = c.refs;
  p.eager = run_eager(*c.model.graph, c.inputs);
  run_pipeline(*c.model.graph, parse_pipeline("core"), PassOptions{});
  p.module = fuse(std::move(c.model.graph));
  return p;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

tile::Dim dim(const std::string& name, int64_t size, int64_t split, int64_t tile, bool reduction = false) {
  tile::Dim d;
  d.name = name;
  d.size = size;
  d.split = std::max<int64_t>(1, std::min(split, size));
  d.slice = std::max<int64_t>(1, ceil_div(size, d.split));
  d.split = std::max<int64_t>(1, ceil_div(size, d.slice));  // no idle cores
  d.tile = std::max<int64_t>(1, std::min(tile, d.slice));
  d.reduction = reduction;
  return d;
}

// A mapping written by hand, independent of map_to_tiles: every graph value a global in the device
// dtype, loop kernels split over p, matmuls split over m and K (a K-split, so partial sums cross
// cores) with small tiles, convs over oc; non-kernel nodes are host steps.
tile::TileProgram hand_map(const KernelModule& m, DType fdt) {
  tile::TileProgram p;
  p.name = "hand";
  p.target = "hand";
  p.float_dtype = fdt;
  p.cores = 4;
  const Graph& g = *m.graph;
  for (const auto& v : g.values()) {
    tile::Global gl;
    gl.name = v->name;
    gl.kind = v->is_input ? tile::Global::Kind::input : v->constant ? tile::Global::Kind::constant : tile::Global::Kind::temp;
    gl.logical = v->type.dtype;
    gl.dtype = is_float(v->type.dtype) ? fdt : v->type.dtype;
    gl.shape = gl.padded = v->type.shape;
    p.globals.push_back(gl);
  }
  int t = 0;
  for (const auto& n : g.nodes()) {
    tile::TileKernel tk;
    tk.name = "t" + std::to_string(t++);
    tk.node = n->name;
    if (!is_kernel_node(*n)) {
      tk.kind = tile::TileKind::host;
      p.kernels.push_back(tk);
      continue;
    }
    tk.kernel = static_cast<int>(n->attr_i("kernel"));
    const Kernel& k = m.kernels[static_cast<size_t>(tk.kernel)];
    if (k.kind == KernelKind::loop) {
      tk.kind = tile::TileKind::vector;
      const int64_t P = k.parallel_extent();
      tk.dims = {dim("p", P, 4, 7), dim("e", k.splits_inner() ? int64_t{1} : int64_t{k.inner_count()}, 1, 1 << 30)};
    } else if (k.kind == KernelKind::matmul) {
      tk.kind = tile::TileKind::matmul;
      tk.dims = {dim("b", k.mm.batch, 1, 2), dim("m", k.mm.m, 2, 48), dim("n", k.mm.n, 1, 96), dim("k", k.mm.k, 2, 40, true)};
    } else {
      tk.kind = tile::TileKind::conv;
      const ConvSpec& c = k.conv;
      tk.dims = {dim("n", c.n, 1, 1), dim("oc", c.oc, 2, 16), dim("s", c.oh * c.ow, 2, 64),
                 dim("r", c.c / c.groups * c.kh * c.kw, 1, 1 << 30, true)};
    }
    tk.cores = 1;
    for (size_t d = 0; d < tk.dims.size(); ++d) {
      tk.cores *= static_cast<int>(tk.dims[d].split);
      tk.order.push_back(static_cast<int>(d));
    }
    p.kernels.push_back(tk);
  }
  return p;
}

struct Errors {
  double worst = 0;    // max over outputs of max|out - ref| / max|ref|
  double max_ref = 0;  // the largest |ref| over the float outputs
};

// max|out - ref| / max|ref| per float output (the criterion); other outputs must be equal.
Errors relative_errors(const std::vector<Tensor>& outs, const std::vector<Tensor>& refs, const std::string& what) {
  Errors e;
  EXPECT_EQ(outs.size(), refs.size()) << what;
  for (size_t i = 0; i < std::min(outs.size(), refs.size()); ++i) {
    EXPECT_EQ(outs[i].shape(), refs[i].shape()) << what << " output " << i;
    if (outs[i].shape() != refs[i].shape()) continue;
    if (!is_float(refs[i].dtype())) {
      EXPECT_EQ(outs[i].to_i64(), refs[i].to_i64()) << what << " output " << i;
      continue;
    }
    const std::vector<double> o = outs[i].to_f64(), r = refs[i].to_f64();
    double max_ref = 0, max_diff = 0;
    for (size_t j = 0; j < r.size(); ++j) {
      max_ref = std::max(max_ref, std::abs(r[j]));
      max_diff = std::max(max_diff, std::isfinite(o[j]) ? std::abs(o[j] - r[j]) : INFINITY);
    }
    e.worst = std::max(e.worst, max_ref > 0 ? max_diff / max_ref : max_diff);
    e.max_ref = std::max(e.max_ref, max_ref);
  }
  return e;
}

const std::vector<std::string> kModels = {"tblock_s",  "tblock_s_dynamo", "tblock_bert",  "ffn_s",        "attn_s",
                                          "bert_tiny", "gpt2_tiny",       "mobilenet_v2", "nonzero_break"};

double tolerance(DType t) { return t == DType::bf16 ? 5e-2 : 2e-2; }

// Checks a functional run against eager and the reference outputs with the stated tolerance. A model
// whose outputs f16 cannot hold at all (every |ref| below f16's smallest subnormal, 2^-24: the
// mobilenet_v2 data set's logits are ~3e-9) cannot match in f16 storage on any device; there the
// simulator must say why: it reports the values it flushed to zero.
void check_run(const dataflow::FunctionalResult& r, const Prepared& pr, DType fdt, const std::string& what) {
  Errors e = relative_errors(r.outputs, pr.eager, what);
  Errors er = relative_errors(r.outputs, pr.refs, what + " vs reference outputs");
  const bool unrepresentable = fdt == DType::f16 && e.max_ref > 0 && e.max_ref < std::ldexp(1.0, -24);
  if (unrepresentable) {
    EXPECT_GT(r.flushed, 0) << what << ": outputs below f16's range, but no flush to zero was reported";
  } else {
    EXPECT_LE(e.worst, tolerance(fdt)) << what;
    EXPECT_LE(er.worst, tolerance(fdt)) << what;
  }
  EXPECT_EQ(r.overflowed, 0) << what << " (first at " << r.first_overflow << ")";
  std::printf("[functional] %-34s rel err vs eager %.3g, vs ref %.3g%s; %lld tiles, %lld host steps, %.3f s (build %.3f s)\n",
              what.c_str(), e.worst, er.worst,
              unrepresentable ? (" (outputs below f16's range: " + std::to_string(r.flushed) + " values flushed, first at " +
                                 r.first_flush + ")").c_str()
                              : "",
              static_cast<long long>(r.tiles_executed), static_cast<long long>(r.host_steps), r.seconds, r.compile_seconds);
}

}  // namespace

// The fast rounding agrees bit for bit with the exact encoder (round to nearest even) on random
// values over every binade the formats hold, halfway cases, subnormals, overflow and specials.
TEST(TileFunctional, RoundingMatchesEncoder) {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.0f, 65520.0f, 70000.0f, -65520.0f, 5.9604645e-8f,
                           2.9802322e-8f, 2.9802326e-8f, 8.9406967e-8f, 6.1035156e-5f, 6.1e-5f, 1e-10f, 3.3895314e38f,
                           INFINITY, -INFINITY, 1.0009766f, 1.00048828125f, 1.00146484375f};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) xs.push_back(std::bit_cast<float>(bits(rng)));
  for (DType t : {DType::f16, DType::bf16})
    for (float x : xs) {
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(dataflow::round_to_dtype(x, t)));
        continue;
      }
      const float want = static_cast<float>(decode_float_bits(t, encode_float_bits(t, x)));
      const float got = dataflow::round_to_dtype(x, t);
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << dtype_name(t) << " of " << x;
    }
}

// Every corpus model under a hand-written mapping (K-split matmuls with ragged tiles, 4-way split
// loop kernels): f16 storage, fp32 compute, against eager and the reference outputs.
class TileFunctionalHand : public ::testing::TestWithParam<std::string> {};

TEST_P(TileFunctionalHand, MatchesEager) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  Prepared pr = prepare(GetParam());
  for (DType fdt : {DType::f16, DType::bf16}) {
    tile::TileProgram p = hand_map(pr.module, fdt);
    dataflow::FunctionalResult r = dataflow::run_functional(p, pr.module, pr.inputs);
    check_run(r, pr, fdt, GetParam() + " hand " + std::string(dtype_name(fdt)));
    EXPECT_GT(r.tiles_executed, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(TileFunctional, TileFunctionalHand, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return info.param; });

// A split whose slices do not cover the dim (the mapper's bug this check exists for) is an Error
// naming the tile kernel, for a matmul's m and for a loop kernel's p; a core count that does not
// match the splits is one too.
TEST(TileFunctional, BrokenSplitIsCoverageError) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  Prepared pr = prepare("tblock_s");
  const tile::TileProgram good = hand_map(pr.module, DType::f16);
  for (tile::TileKind kind : {tile::TileKind::matmul, tile::TileKind::vector}) {
    tile::TileProgram p = good;
    tile::TileKernel* victim = nullptr;
    for (auto& k : p.kernels)
      if (k.kind == kind && k.dims[kind == tile::TileKind::matmul ? 1 : 0].split > 1) {
        victim = &k;
        break;
      }
    ASSERT_TRUE(victim);
    tile::Dim& d = victim->dims[kind == tile::TileKind::matmul ? 1 : 0];
    d.slice -= 1;  // the last core's slice now ends short of the dim
    try {
      dataflow::run_functional(p, pr.module, pr.inputs);
      ADD_FAILURE() << "a broken split of " << victim->name << " ran";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(victim->name + ":"), std::string::npos) << msg;
      EXPECT_NE(msg.find("covered by no core"), std::string::npos) << msg;
    }
    tile::TileProgram q = good;
    for (auto& k : q.kernels)
      if (k.name == victim->name) k.cores += 1;
    EXPECT_THROW(dataflow::run_functional(q, pr.module, pr.inputs), Error);
  }
  // Slices that overlap cannot come from the split arithmetic, but tiles larger than a slice reach
  // into the next core's slice only if clipped wrongly; tile_ranges clips, so the per-dim partition
  // always holds for a well-formed dim.
  tile::TileKernel k;
  k.name = "tx";
  k.dims = {dim("p", 10, 3, 2)};
  auto r = dataflow::tile_ranges(k);
  ASSERT_EQ(r[0].size(), 3u);
  EXPECT_EQ(r[0][2].back().hi, 10);
  k.dims[0].split = 2;  // 2 slices of 4 leave 8..9 uncovered
  EXPECT_THROW(dataflow::tile_ranges(k), Error);
}

// Every corpus model through map_to_tiles on the spyre (f16 and bf16 storage) and tpu-v5e (bf16)
// presets, run by the functional simulator, against eager and the reference outputs.
class TileFunctionalMapped : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(TileFunctionalMapped, MatchesEager) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  const auto& [model, preset] = GetParam();
  Prepared pr = prepare(model);
  const hw::HwSpec hw = hw::load_preset(preset);
  int runs = 0;
  for (DType fdt : {DType::f16, DType::bf16}) {
    if (std::find(hw.dtypes.begin(), hw.dtypes.end(), fdt) == hw.dtypes.end()) continue;
    dataflow::MapOptions mo;
    mo.float_dtype = fdt;
    const auto t0 = std::chrono::steady_clock::now();
    tile::TileProgram p = dataflow::map_to_tiles(pr.module, hw, mo);
    const double map_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tile::verify_tile_program(p);
    dataflow::FunctionalResult r = dataflow::run_functional(p, pr.module, pr.inputs);
    check_run(r, pr, fdt, model + " " + preset + " " + std::string(dtype_name(fdt)));
    std::printf("[functional]   (map_to_tiles %.3f s)\n", map_s);
    ++runs;
  }
  EXPECT_GT(runs, 0) << preset << " stores neither f16 nor bf16";
}

INSTANTIATE_TEST_SUITE_P(TileFunctional, TileFunctionalMapped,
                         ::testing::Combine(::testing::ValuesIn(kModels), ::testing::Values("spyre", "tpu-v5e")),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// The mapper's own split, broken after the fact: a matmul dim's slice one short, and a loop
// kernel's split halved, are coverage errors naming the tile kernel.
TEST(TileFunctional, BrokenMappedSplitIsCoverageError) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  Prepared pr = prepare("tblock_s");
  const hw::HwSpec hw = hw::load_preset("spyre");
  const tile::TileProgram good = dataflow::map_to_tiles(pr.module, hw);
  EXPECT_NO_THROW(dataflow::run_functional(good, pr.module, pr.inputs));
  int broken = 0;
  for (size_t i = 0; i < good.kernels.size(); ++i) {
    const tile::TileKernel& k = good.kernels[i];
    if (k.kind == tile::TileKind::host) continue;
    for (size_t d = 0; d < k.dims.size(); ++d) {
      if (k.dims[d].split < 2) continue;
      tile::TileProgram p = good;
      tile::Dim& dim = p.kernels[i].dims[d];
      if (broken % 2 == 0) {
        dim.slice -= 1;  // the last core's slice ends short
      } else {
        dim.split /= 2;  // half the cores: the upper part of the dim is nobody's
        p.kernels[i].cores /= static_cast<int>(k.dims[d].split / dim.split);
      }
      try {
        dataflow::run_functional(p, pr.module, pr.inputs);
        ADD_FAILURE() << "a broken split of " << k.name << " dim " << k.dims[d].name << " ran";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(k.name + ": coverage error in dim " + k.dims[d].name), std::string::npos)
            << e.what();
      }
      ++broken;
      break;
    }
    if (broken >= 4) break;
  }
  EXPECT_GT(broken, 0) << "the mapping splits no kernel over cores";
}

// DLFloat16 (Spyre's storage of f16): 9 fraction bits rounded to nearest even, no subnormals, the
// range 2^-30 .. (2 - 2^-8)·2^32; checked against values worked out by hand.
TEST(TileFunctional, Dl16Rounding) {
  EXPECT_EQ(dataflow::round_to_dl16(1.0f), 1.0f);
  EXPECT_EQ(dataflow::round_to_dl16(1.0f + 1.0f / 512), 1.0f + 1.0f / 512);          // 9 fraction bits kept
  EXPECT_EQ(dataflow::round_to_dl16(1.0f + 1.0f / 1024), 1.0f);                      // halfway: to even
  EXPECT_EQ(dataflow::round_to_dl16(1.0f + 3.0f / 1024), 1.0f + 4.0f / 1024);        // halfway: to even (up)
  EXPECT_EQ(dataflow::round_to_dl16(1.0f + 1.0f / 1024 + 1.0f / 65536), 1.0f + 1.0f / 512);  // past halfway
  // 3e-9 = 2^-29 · 1.61061..., 0.61061·512 = 312.6 -> 313: f16 flushes this, DL16 holds it
  EXPECT_EQ(dataflow::round_to_dl16(-3e-9f), -std::ldexp(1.0f + 313.0f / 512, -29));
  EXPECT_EQ(dataflow::round_to_dl16(std::ldexp(1.0f, -30)), std::ldexp(1.0f, -30));  // smallest normal
  EXPECT_EQ(dataflow::round_to_dl16(std::ldexp(1.0f, -31)), 0.0f);                   // midpoint to 0
  EXPECT_EQ(dataflow::round_to_dl16(std::ldexp(1.5f, -31)), std::ldexp(1.0f, -30));  // nearer the smallest normal
  EXPECT_EQ(dataflow::round_to_dl16(std::ldexp(1.0f, -32)), 0.0f);
  const float top = std::ldexp(2.0f - std::ldexp(1.0f, -8), 32);                   // largest finite
  EXPECT_EQ(dataflow::round_to_dl16(top), top);
  EXPECT_TRUE(std::isinf(dataflow::round_to_dl16(std::ldexp(2.0f, 32))));
  EXPECT_TRUE(std::isinf(dataflow::round_to_dl16(-std::ldexp(1.999f, 32))));
  EXPECT_TRUE(std::isnan(dataflow::round_to_dl16(NAN)));
  // 70000 = 2^16 · 1.068115, 0.068115·512 = 34.9 -> 35: f16 overflows here
  EXPECT_EQ(dataflow::round_to_dl16(70000.0f), std::ldexp(1.0f + 35.0f / 512, 16));
}
