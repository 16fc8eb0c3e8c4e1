// The executable cache (compile_model_cpu): a warm start loads what a cold compile stored — kernel
// module, constants, oneDNN's packed weights, the shared object — and computes the same outputs as
// the model's references; a changed model, other options or a damaged entry never reuse a stale one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "corpus_util.h"
#include "tessel/driver/compile_model.h"
#include "tessel/runtime/interpreter.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("tessel-{}-{}", name, static_cast<long>(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

ModelCompileOptions options(const std::string& cache, int threads = 2) {
  ModelCompileOptions o;
  o.backend.threads = threads;
  o.backend.toolchain.cache_dir = cache;
  return o;
}

struct Data {
  std::string model;
  std::vector<Tensor> inputs, refs;
};

Data data_of(const std::string& name) {
  ModelPaths mp = resolve_model(testenv::shared_dir() + "/models/" + name);
  return {mp.model, read_data_set(mp.data_sets.at(0), "input"), read_data_set(mp.data_sets.at(0), "output")};
}

// Cold compile stores an entry; the warm start loads it (no import), prepacks every constant weight
// and matches the references; a third start hits the same entry.
void round_trip(const std::string& name, int expect_prepacked) {
  const std::string cache = fresh_dir("exe-" + name);
  Data d = data_of(name);
  ModelCompile cold = compile_model_cpu(d.model, d.inputs, options(cache));
  EXPECT_FALSE(cold.entry_hit);
  EXPECT_TRUE(cold.not_stored.empty()) << cold.not_stored;
  ASSERT_FALSE(cold.entry_dir.empty());
  for (const char* f : {"manifest.json", "module.tkl", "constants.bin", "packed.bin"})
    EXPECT_TRUE(fs::exists(fs::path(cold.entry_dir) / f)) << f;
  std::vector<Tensor> want = cold.exe->run(d.inputs);
  testenv::expect_matches_reference(want, d.refs, name + " cold");

  ModelCompile warm = compile_model_cpu(d.model, d.inputs, options(cache));
  EXPECT_TRUE(warm.entry_hit) << warm.load_error;
  EXPECT_EQ(warm.entry_dir, cold.entry_dir);
  EXPECT_EQ(warm.import_seconds, 0);
  EXPECT_TRUE(warm.exe->stats().loaded);
  EXPECT_EQ(warm.exe->stats().prepacked, expect_prepacked);
  EXPECT_EQ(warm.exe->stats().kernels, cold.exe->stats().kernels);
  std::vector<Tensor> got = warm.exe->run(d.inputs);
  testenv::expect_matches_reference(got, d.refs, name + " from the executable cache");
  // Same kernels, same packed bytes, same thread split: the same numbers.
  testenv::expect_matches_reference(got, want, name + " warm vs cold", 1e-6);
  ModelCompile again = compile_model_cpu(d.model, d.inputs, options(cache));
  EXPECT_TRUE(again.entry_hit);
  fs::remove_all(cache);
}

}  // namespace

TEST(ExecutableCache, TransformerBlockRoundTrip) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  round_trip("tblock_s", 4);  // qkv, out, ffn1, ffn2 (q·k and p·v have no constant operand)
}

TEST(ExecutableCache, ConvNetRoundTrip) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  // every convolution and the classifier's matmul
  Data d = data_of("mobilenet_v2");
  ModelCompile probe = compile_model_cpu(d.model, d.inputs, [] {
    ModelCompileOptions o;
    o.executable_cache = false;
    o.backend.threads = 2;
    o.backend.toolchain.cache_dir = fresh_dir("exe-probe");
    return o;
  }());
  const int convs = probe.exe->stats().conv_kernels + probe.exe->stats().matmul_kernels;
  EXPECT_GT(convs, 50);
  round_trip("mobilenet_v2", convs);
}

// A text model rewritten with other weights gets a new entry (the key covers the file's bytes), and
// the result follows the new weights (checked against the eager interpreter).
TEST(ExecutableCache, ChangedModelIsNotReused) {
  const std::string dir = fresh_dir("exe-changed");
  const std::string model = dir + "/m.tsl";
  auto write = [&](float scale) {
    std::ofstream f(model);
    f << "graph @m(%x: f32[4,8]) {\n  const %w: f32[8,16] = blob<0>\n"
      << "  %y: f32[4,16] = MatMul(%x, %w) loc(\"mm\")\n  %z: f32[4,16] = Relu(%y) loc(\"relu\")\n  return %z\n}\nblobs {\n  0: \"";
    std::vector<float> w(128);
    for (size_t i = 0; i < w.size(); ++i) w[i] = scale * (static_cast<float>(i % 7) - 3.0f);
    static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const auto* p = reinterpret_cast<const uint8_t*>(w.data());
    const size_t n = w.size() * 4;
    for (size_t i = 0; i < n; i += 3) {
      uint32_t v = p[i] << 16 | (i + 1 < n ? p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
      f << b64[v >> 18 & 63] << b64[v >> 12 & 63] << (i + 1 < n ? b64[v >> 6 & 63] : '=') << (i + 2 < n ? b64[v & 63] : '=');
    }
    f << "\"\n}\n";
  };
  Tensor x(DType::f32, {4, 8});
  for (int64_t i = 0; i < x.numel(); ++i) x.set_f(i, 0.25 * static_cast<double>(i % 5) - 0.4);
  auto eager = [&] { return run_eager(*import_model_file(model).graph, {x}); };

  write(1.0f);
  ModelCompile a = compile_model_cpu(model, {x}, options(dir + "/cache"));
  EXPECT_FALSE(a.entry_hit);
  testenv::expect_matches_reference(a.exe->run({x}), eager(), "first weights");
  ModelCompile a2 = compile_model_cpu(model, {x}, options(dir + "/cache"));
  EXPECT_TRUE(a2.entry_hit);

  write(-2.0f);  // same size, same second: only the bytes tell
  ModelCompile b = compile_model_cpu(model, {x}, options(dir + "/cache"));
  EXPECT_FALSE(b.entry_hit);
  EXPECT_NE(b.entry_dir, a.entry_dir);
  testenv::expect_matches_reference(b.exe->run({x}), eager(), "second weights");

  // other options: another entry
  ModelCompile c = compile_model_cpu(model, {x}, options(dir + "/cache", 1));
  EXPECT_FALSE(c.entry_hit);
  EXPECT_NE(c.entry_dir, b.entry_dir);
  fs::remove_all(dir);
}

// A damaged entry is reported and replaced; the executable still computes the right thing.
TEST(ExecutableCache, DamagedEntryIsRecompiled) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  const std::string cache = fresh_dir("exe-damaged");
  Data d = data_of("tblock_s");
  ModelCompile cold = compile_model_cpu(d.model, d.inputs, options(cache));
  ASSERT_FALSE(cold.entry_dir.empty());
  const fs::path entry = cold.entry_dir;
  cold.exe.reset();
  fs::resize_file(entry / "packed.bin", 1000);  // e.g. a disk that filled up
  ModelCompile again = compile_model_cpu(d.model, d.inputs, options(cache));
  EXPECT_FALSE(again.entry_hit);
  EXPECT_NE(again.load_error.find("packed.bin"), std::string::npos) << again.load_error;
  testenv::expect_matches_reference(again.exe->run(d.inputs), d.refs, "tblock_s after a damaged entry");
  ModelCompile fixed = compile_model_cpu(d.model, d.inputs, options(cache));
  EXPECT_TRUE(fixed.entry_hit) << fixed.load_error;

  {
    std::ofstream m(entry / "manifest.json");
    m << "{ not json";
  }
  ModelCompile bad = compile_model_cpu(d.model, d.inputs, options(cache));
  EXPECT_FALSE(bad.entry_hit);
  EXPECT_NE(bad.load_error.find("manifest"), std::string::npos) << bad.load_error;
  testenv::expect_matches_reference(bad.exe->run(d.inputs), d.refs, "tblock_s after a damaged manifest");
  fs::remove_all(cache);
}
