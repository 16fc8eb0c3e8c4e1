// The executable cache (compile_model_cpu): a warm start loads what a cold compile stored — kernel
// module, constants, oneDNN's packed weights, the shared object — and computes the same outputs as
// the model's references; a changed model, other options or a damaged entry never reuse a stale one.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "corpus_util.h"
#include "graph_test_util.h"
#include "tessel/driver/compile_model.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/checksum.h"

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

// A .tsl model file written by the project's printer (large constants go in its base64 blobs section).
using testenv::op_node;
void write_model(const std::string& path, Graph& g) {
  infer_graph(g);
  std::ofstream(path) << print_graph(g);
}
Tensor filled_f32(Shape s, const std::function<double(int64_t)>& f) {
  Tensor t(DType::f32, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f(i, static_cast<double>(static_cast<float>(f(i))));
  return t;
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
    Graph g;
    Value* x = g.add_input("x", TensorType{DType::f32, {4, 8}});
    Value* w = g.add_constant("w", filled_f32({8, 16}, [&](int64_t i) { return scale * (static_cast<double>(i % 7) - 3.0); }));
    g.outputs = {op_node(g, "Relu", "relu", {op_node(g, "MatMul", "mm", {x, w})})};
    write_model(model, g);
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

// ---- Integrity (issue 12): every damaged entry is reported once and rebuilt, never a wrong hit ----

namespace {

nlohmann::json manifest_of(const fs::path& entry) {
  std::ifstream f(entry / "manifest.json");
  return nlohmann::json::parse(f);
}

std::string read_bytes(const fs::path& p, uint64_t at, uint64_t n) {
  std::ifstream f(p, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  std::string s(n, '\0');
  f.read(s.data(), static_cast<std::streamsize>(n));
  return s;
}

void write_bytes(const fs::path& p, uint64_t at, const std::string& s) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

void flip_byte(const fs::path& p, uint64_t at) {
  std::string b = read_bytes(p, at, 1);
  b[0] = static_cast<char>(b[0] ^ 0x40);  // a float's exponent bit when `at` is its last byte
  write_bytes(p, at, b);
}

// tblock_s compiled cold into a fresh cache; `damage` edits its entry; the next start must not be a
// hit, must print exactly one line naming `file`, and must compute the references; the start after
// that is a hit again (the entry was replaced).
void expect_reported_and_rebuilt(const std::string& test, const std::function<void(const fs::path&)>& damage,
                                 const std::string& file) {
  const std::string cache = fresh_dir(test);
  Data d = data_of("tblock_s");
  ModelCompile cold = compile_model_cpu(d.model, d.inputs, options(cache));
  ASSERT_FALSE(cold.entry_dir.empty());
  cold.exe.reset();
  damage(cold.entry_dir);
  testing::internal::CaptureStderr();
  ModelCompile again = compile_model_cpu(d.model, d.inputs, options(cache));
  const std::string report = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(again.entry_hit) << test << ": a damaged entry was used";
  EXPECT_EQ(std::count(report.begin(), report.end(), '\n'), 1) << test << ":\n" << report;
  EXPECT_NE(report.find(file), std::string::npos) << test << ":\n" << report;
  testenv::expect_matches_reference(again.exe->run(d.inputs), d.refs, test);
  ModelCompile fixed = compile_model_cpu(d.model, d.inputs, options(cache));
  EXPECT_TRUE(fixed.entry_hit) << test << ": " << fixed.load_error;
  testenv::expect_matches_reference(fixed.exe->run(d.inputs), d.refs, test + " (replaced entry)");
  fs::remove_all(cache);
}

}  // namespace

TEST(ExecutableCacheIntegrity, FlippedPackedWeightsAreRebuilt) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  expect_reported_and_rebuilt("exe-flip-packed", [](const fs::path& e) {
    const nlohmann::json m = manifest_of(e);
    const nlohmann::json& p = m.at("packed").at(0);
    flip_byte(e / "packed.bin", p.at("offset").get<uint64_t>() + p.at("nbytes").get<uint64_t>() / 2 + 3);
  }, "packed.bin");
}

TEST(ExecutableCacheIntegrity, FlippedConstantsAreRebuilt) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  expect_reported_and_rebuilt("exe-flip-constants", [](const fs::path& e) {
    const nlohmann::json m = manifest_of(e);
    for (const auto& b : m.at("blobs")) flip_byte(e / "constants.bin", b.at(0).get<uint64_t>() + 3);
  }, "constants.bin");
}

// Two blobs of the same size exchanged: sizes and offsets all fit, only the bytes tell.
TEST(ExecutableCacheIntegrity, SwappedBlobsAreRebuilt) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  expect_reported_and_rebuilt("exe-swap-blobs", [](const fs::path& e) {
    const nlohmann::json blobs = manifest_of(e).at("blobs");
    const fs::path c = e / "constants.bin";
    for (size_t i = 0; i < blobs.size(); ++i)
      for (size_t j = i + 1; j < blobs.size(); ++j) {
        const uint64_t n = blobs[i].at(1).get<uint64_t>();
        if (blobs[j].at(1).get<uint64_t>() != n) continue;
        const std::string a = read_bytes(c, blobs[i].at(0).get<uint64_t>(), n);
        const std::string b = read_bytes(c, blobs[j].at(0).get<uint64_t>(), n);
        if (a == b) continue;
        write_bytes(c, blobs[i].at(0).get<uint64_t>(), b);
        write_bytes(c, blobs[j].at(0).get<uint64_t>(), a);
        return;
      }
    FAIL() << "no two blobs of one size in tblock_s's entry";
  }, "constants.bin");
}

// A change of the kernel module's text that still parses: LayerNorm's epsilon (1e-5 in f32) becomes 0.1.
constexpr const char* kModuleEditFrom = "9.9999997473787516e-06";
constexpr const char* kModuleEditTo = "9.9999997473787516e-01";
TEST(ExecutableCacheIntegrity, EditedModuleTextIsRebuilt) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  expect_reported_and_rebuilt("exe-edit-module", [](const fs::path& e) {
    std::string text = testenv::read_text((e / "module.tkl").string());
    const size_t at = text.find(kModuleEditFrom);
    ASSERT_NE(at, std::string::npos) << "module.tkl has no '" << kModuleEditFrom << "'";
    text.replace(at, std::string(kModuleEditFrom).size(), kModuleEditTo);
    std::ofstream(e / "module.tkl", std::ios::binary | std::ios::trunc) << text;
  }, "module.tkl");
}

// The executable cache finds the damaged kernels.so first; the compile cache, rebuilding it, does
// not report it a second time.
TEST(ExecutableCacheIntegrity, TruncatedSharedObjectOfAnEntryIsReportedOnce) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  expect_reported_and_rebuilt("exe-truncated-so", [](const fs::path& e) {
    const std::string so = manifest_of(e).at("so_path").get<std::string>();
    fs::resize_file(so, fs::file_size(so) / 2);
  }, "kernels.so");
}

TEST(ExecutableCacheIntegrity, MissingFileIsRebuilt) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  expect_reported_and_rebuilt("exe-missing", [](const fs::path& e) { fs::remove(e / "constants.bin"); }, "constants.bin");
}

TEST(ExecutableCacheIntegrity, OffsetOutsideTheFileIsRebuilt) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  expect_reported_and_rebuilt("exe-offset", [](const fs::path& e) {
        std::string text = testenv::read_text((e / "manifest.json").string());
    nlohmann::json j = nlohmann::json::parse(text);
    j["packed"][0]["offset"] = uint64_t{1} << 40;
    std::ofstream(e / "manifest.json", std::ios::trunc) << j.dump(1);
  }, "manifest.json");
}

// The whole entry of another model (same inputs and options) under this model's key: every file
// agrees with the manifest, only the key tells. Before: the other model's weights ran.
TEST(ExecutableCacheIntegrity, AnotherModelsEntryIsRebuilt) {
  const std::string dir = fresh_dir("exe-other-entry");
  const std::string a = dir + "/a.tsl", b = dir + "/b.tsl";
  auto write = [](const std::string& path, float scale) {
    std::ofstream f(path);
    f << "graph @m(%x: f32[4,8]) {\n  const %w: f32[8,16] = [";
    for (int i = 0; i < 128; ++i) f << (i ? ", " : "") << scale * static_cast<float>(i % 7 - 3);
    f << "]\n  %y: f32[4,16] = MatMul(%x, %w) loc(\"mm\")\n  %z: f32[4,16] = Relu(%y) loc(\"relu\")\n  return %z\n}\n";
  };
  write(a, 1.0f);
  write(b, -0.5f);
  Tensor x(DType::f32, {4, 8});
  for (int64_t i = 0; i < x.numel(); ++i) x.set_f(i, 0.25 * static_cast<double>(i % 5) - 0.4);
  ModelCompile ma = compile_model_cpu(a, {x}, options(dir + "/cache"));
  ModelCompile mb = compile_model_cpu(b, {x}, options(dir + "/cache"));
  ASSERT_FALSE(ma.entry_dir.empty());
  ASSERT_NE(ma.entry_dir, mb.entry_dir);
  ma.exe.reset();
  mb.exe.reset();
  fs::remove_all(mb.entry_dir);
  fs::copy(ma.entry_dir, mb.entry_dir, fs::copy_options::recursive);
  testing::internal::CaptureStderr();
  ModelCompile again = compile_model_cpu(b, {x}, options(dir + "/cache"));
  const std::string report = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(again.entry_hit);
  EXPECT_EQ(std::count(report.begin(), report.end(), '\n'), 1) << report;
  EXPECT_NE(report.find("manifest.json"), std::string::npos) << report;
  testenv::expect_matches_reference(again.exe->run({x}), run_eager(*import_model_file(b).graph, {x}), "b from its own entry");
  fs::remove_all(dir);
}

// A compile killed while writing leaves `<key>.tessel-tmp.<pid>`; the next write into the cache sweeps
// those of dead processes and keeps a live process's.
TEST(ExecutableCacheIntegrity, StaleTemporaryEntriesAreSwept) {
  const std::string dir = fresh_dir("exe-sweep");
  const std::string model = dir + "/m.tsl";
  std::ofstream(model) << "graph @m(%x: f32[4,8]) {\n  %z: f32[4,8] = Relu(%x) loc(\"relu\")\n  return %z\n}\n";
  const fs::path exe = fs::path(dir) / "cache" / "exe";
  const pid_t dead = [] {
    const pid_t p = fork();
    if (p == 0) std::_Exit(0);
    waitpid(p, nullptr, 0);
    return p;
  }();
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(5);
  const fs::path dead_entry = exe / fmt::format("0123abcd.tessel-tmp.{}", dead);
  const fs::path dead_index = exe / "files" / fmt::format("0123abcd.txt.tessel-tmp.{}", dead);
  const fs::path live_entry = exe / fmt::format("4567abcd.tessel-tmp.{}", getpid());
  fs::create_directories(dead_entry);
  fs::create_directories(live_entry);
  fs::create_directories(dead_index.parent_path());
  std::ofstream(dead_entry / "packed.bin") << "partial";
  std::ofstream(dead_index) << "partial";
  for (const fs::path& p : {dead_entry, dead_index, live_entry}) fs::last_write_time(p, old);
  Tensor x(DType::f32, {4, 8});
  ModelCompile m = compile_model_cpu(model, {x}, options(dir + "/cache"));
  EXPECT_FALSE(m.entry_hit);
  EXPECT_FALSE(fs::exists(dead_entry));
  EXPECT_FALSE(fs::exists(dead_index));
  EXPECT_TRUE(fs::exists(live_entry));
  fs::remove_all(dir);
}

// Two processes compiling the same model into one cold cache at once both succeed (each checks its
// outputs against the references), and leave one entry and no temporary files behind.
TEST(ExecutableCacheIntegrity, ConcurrentColdCompilesBothSucceed) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  const std::string dir = fresh_dir("exe-concurrent");
  const std::string model = testenv::shared_dir() + "/models/tblock_s";
  const std::string run = fmt::format("TESSEL_CACHE_DIR='{}/cache' '{}' run '{}' --backend compiled --check --threads 1",
                                      dir, testenv::tessel_binary(), model);
  const std::string script = fmt::format("({0} > '{1}/a.log' 2>&1; echo $? > '{1}/a.rc') & "
                                         "({0} > '{1}/b.log' 2>&1; echo $? > '{1}/b.rc') & wait",
                                         run, dir);
  ASSERT_EQ(std::system(script.c_str()), 0);
  for (const char* who : {"a", "b"}) {
    EXPECT_EQ(testenv::read_text(fmt::format("{}/{}.rc", dir, who)), "0\n")
        << testenv::read_text(fmt::format("{}/{}.log", dir, who));
    EXPECT_NE(testenv::read_text(fmt::format("{}/{}.log", dir, who)).find("PASS"), std::string::npos);
  }
  int entries = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir + "/cache")) {
    EXPECT_EQ(e.path().filename().string().find(".tessel-tmp."), std::string::npos) << e.path();
    entries += e.path().filename() == "manifest.json";
  }
  EXPECT_EQ(entries, 1);
  ASSERT_EQ(std::system(fmt::format("{} > '{}/c.log' 2>&1", run, dir).c_str()), 0);
  const std::string third = testenv::read_text(dir + "/c.log");
  EXPECT_NE(third.find("executable cache entry:"), std::string::npos) << "a third run is a hit:\n" << third;
  fs::remove_all(dir);
}

// ---- The entry reader is total (check_cpu_entry, also the cache-entry fuzzer's entry point) ----

namespace {

// A small entry with a shared object and packed weights (a MatMul + Relu .tsl model).
std::string small_entry(const std::string& dir) {
  const std::string model = dir + "/m.tsl";
  {
    std::ofstream f(model);
    f << "graph @m(%x: f32[4,8]) {\n  const %w: f32[8,16] = [";
    for (int i = 0; i < 128; ++i) f << (i ? ", " : "") << static_cast<float>(i % 7 - 3);
    f << "]\n  %y: f32[4,16] = MatMul(%x, %w) loc(\"mm\")\n  %z: f32[4,16] = Relu(%y) loc(\"relu\")\n  return %z\n}\n";
  }
  Tensor x(DType::f32, {4, 8});
  ModelCompile m = compile_model_cpu(model, {x}, options(dir + "/cache"));
  EXPECT_FALSE(m.entry_dir.empty());
  return m.entry_dir;
}

void copy_entry(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

// Rewrites manifest.json with `edit` applied and its own checksum recomputed (a forged manifest).
void forge_manifest(const fs::path& entry, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = manifest_of(entry);
  edit(j);
  j.erase("checksum");
  const std::string text = j.dump();
  j["checksum"] = checksum_bytes(text.data(), text.size()).xxh3;
  std::ofstream(entry / "manifest.json", std::ios::trunc) << j.dump(1);
}

}  // namespace

// Random damage to every file: with checksums on, every damaged entry is refused with a
// tessel::Error; with them off (what a forged checksum would allow), the parsers behind them still
// only load or throw tessel::Error.
TEST(ExecutableCacheIntegrity, EntryReaderIsTotalOverDamagedBytes) {
  const std::string dir = fresh_dir("exe-total");
  const fs::path pristine = small_entry(dir);
  ASSERT_GT(check_cpu_entry(pristine.string()), 0u);
  const fs::path work = fs::path(dir) / "work";
  std::mt19937 rng(12);
  const char* files[] = {"manifest.json", "module.tkl", "constants.bin", "packed.bin"};
  int loaded_unverified = 0;
  for (int round = 0; round < 400; ++round) {
    copy_entry(pristine, work);
    const fs::path f = work / files[rng() % 4];
    std::string bytes = testenv::read_text(f.string());
    switch (rng() % 4) {
      case 0: bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255); break;
      case 1: bytes.resize(rng() % bytes.size()); break;
      case 2: bytes += std::string(1 + rng() % 5000, static_cast<char>(rng())); break;
      default: {  // a digit run becomes another number (in the manifest: offsets, sizes, indices)
        const size_t at = bytes.find_first_of("0123456789", rng() % bytes.size());
        if (at == std::string::npos) continue;
        static const char* numbers[] = {"18446744073709551615", "-1", "1e308", "4096", "0", "9223372036854775808", "0.5"};
        bytes.replace(at, 1, numbers[rng() % 7]);
      }
    }
    std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
    // Not damage: the same bytes, or a manifest whose JSON means the same (whitespace appended).
    const std::string original = testenv::read_text((pristine / f.filename()).string());
    const bool same = bytes == original || (f.filename() == "manifest.json" && nlohmann::json::accept(bytes) &&
                                            nlohmann::json::parse(bytes) == nlohmann::json::parse(original));
    try {
      check_cpu_entry(work.string());
      EXPECT_TRUE(same) << "round " << round << ": damaged " << f.filename() << " passed the checksums";
    } catch (const Error&) {
      EXPECT_FALSE(same) << "round " << round << ": undamaged " << f.filename() << " refused";
    }
    try {
      check_cpu_entry(work.string(), false);
      ++loaded_unverified;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(loaded_unverified, 0);  // some damage (a padding byte, a weight) is only in the values
  fs::remove_all(dir);
}

// Forged manifests (their own checksum recomputed) with offsets that wrap around 2^64, misaligned
// offsets, a packed weight for a kernel that does not exist, or negative and fractional numbers:
// each an error naming the file, never an out-of-bounds pointer.
TEST(ExecutableCacheIntegrity, ForgedManifestOffsetsAreRefused) {
  const std::string dir = fresh_dir("exe-forged");
  const fs::path pristine = small_entry(dir);
  const fs::path work = fs::path(dir) / "work";
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* file;
  };
  const std::vector<Case> cases = {
      {"wrapping blob", [](nlohmann::json& j) { j["blobs"][0] = {~uint64_t{0} - 63, 128}; }, "constants.bin"},
      {"misaligned blob", [](nlohmann::json& j) { j["blobs"][0][0] = 4; }, "constants.bin"},
      {"wrapping packed", [](nlohmann::json& j) { j["packed"][0]["offset"] = ~uint64_t{0} - 4095; }, "packed.bin"},
      {"packed past end", [](nlohmann::json& j) { j["packed"][0]["nbytes"] = uint64_t{1} << 40; }, "packed.bin"},
      {"no such kernel", [](nlohmann::json& j) { j["packed"][0]["kernel"] = 1000; }, "module.tkl"},
      {"negative offset", [](nlohmann::json& j) { j["packed"][0]["offset"] = -4096; }, "manifest.json"},
      {"fractional size", [](nlohmann::json& j) { j["files"]["packed.bin"]["size"] = 1e300; }, "manifest.json"},
      {"threads", [](nlohmann::json& j) { j["threads"] = 1e300; }, "manifest.json"},
      {"blobs not a list", [](nlohmann::json& j) { j["blobs"] = 7; }, "manifest.json"},
  };
  ASSERT_FALSE(manifest_of(pristine).at("packed").empty());
  for (const Case& c : cases) {
    copy_entry(pristine, work);
    forge_manifest(work, c.edit);
    try {
      check_cpu_entry(work.string());
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.file), std::string::npos) << c.what << ": " << e.what();
    }
  }
  fs::remove_all(dir);
}

// A FIFO or a folder in a file's place is refused at once (reading a FIFO would block forever).
TEST(ExecutableCacheIntegrity, NonRegularFilesAreRefused) {
  const std::string dir = fresh_dir("exe-fifo");
  const fs::path pristine = small_entry(dir);
  const fs::path work = fs::path(dir) / "work";
  for (const char* f : {"manifest.json", "module.tkl", "constants.bin", "packed.bin"}) {
    copy_entry(pristine, work);
    fs::remove(work / f);
    ASSERT_EQ(mkfifo((work / f).c_str(), 0600), 0);
    try {
      check_cpu_entry(work.string());
      ADD_FAILURE() << f << " as a FIFO: accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected a regular"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

// Two matmuls reading the same constant weights (tied or shared layers, as in ALBERT) pack them once
// and the entry stores that packing once; a third reads the same bytes transposed, which are other
// weights and get their own packing. Every result is checked against the eager interpreter.
TEST(ExecutableCache, SharedWeightsArePackedAndStoredOnce) {
  const std::string dir = fresh_dir("exe-shared");
  const std::string model = dir + "/m.tsl";
  {
    Graph g;
    Value* x = g.add_input("x", TensorType{DType::f32, {4, 16}});
    Value* w = g.add_constant("w", filled_f32({16, 16}, [](int64_t i) { return 0.1 * static_cast<double>(i * 7 % 13 - 6); }));
    Value* u = op_node(g, "MatMul", "mm2", {op_node(g, "Relu", "relu", {op_node(g, "MatMul", "mm1", {x, w})}), w});
    Value* wt = op_node(g, "Transpose", "wt", {w}, {{"perm", std::vector<int64_t>{1, 0}}});
    g.outputs = {u, op_node(g, "MatMul", "mm3", {u, wt})};
    write_model(model, g);
  }
  Tensor x(DType::f32, {4, 16});
  for (int64_t i = 0; i < x.numel(); ++i) x.set_f(i, 0.25 * static_cast<double>(i % 5) - 0.4);
  const std::vector<Tensor> ref = run_eager(*import_model_file(model).graph, {x});

  ModelCompile cold = compile_model_cpu(model, {x}, options(dir + "/cache"));
  ASSERT_FALSE(cold.entry_hit);
  EXPECT_EQ(cold.exe->stats().matmul_kernels, 3);
  EXPECT_EQ(cold.exe->stats().shared_packings, 1) << "mm2 should take mm1's packing, mm3 not";
  testenv::expect_matches_reference(cold.exe->run({x}), ref, "shared weights, cold");

  const nlohmann::json manifest = nlohmann::json::parse(testenv::read_text(cold.entry_dir + "/manifest.json"));
  std::set<uint64_t> offsets;
  for (const auto& p : manifest.at("packed")) offsets.insert(p.at("offset").get<uint64_t>());
  EXPECT_EQ(manifest.at("packed").size(), 3u);
  EXPECT_EQ(offsets.size(), 2u) << "the shared packing is stored once";

  ModelCompile warm = compile_model_cpu(model, {x}, options(dir + "/cache"));
  ASSERT_TRUE(warm.entry_hit) << warm.load_error;
  EXPECT_EQ(warm.exe->stats().prepacked, 3);
  testenv::expect_matches_reference(warm.exe->run({x}), ref, "shared weights, from the cache");
  fs::remove_all(dir);
}

// issue 41: a FIFO (or a link to /dev/zero) in place of a model-hash index file is a miss -- the model is
// hashed again -- not a run that blocks for a writer or reads gigabytes.
TEST(ExecutableCacheIntegrity, AnIndexThatIsNoRegularFileIsAMiss) {
  const std::string dir = fresh_dir("exe-index-fifo");
  const std::string model = dir + "/m.tsl";
  std::ofstream(model) << "graph @m(%x: f32[4,8]) {\n  %z: f32[4,8] = Relu(%x) loc(\"relu\")\n  return %z\n}\n";
  Tensor x(DType::f32, {4, 8});
  ASSERT_FALSE(compile_model_cpu(model, {x}, options(dir + "/cache")).entry_hit);
  const fs::path files = fs::path(dir) / "cache" / "exe" / "files";
  std::vector<fs::path> index;
  for (const auto& e : fs::directory_iterator(files)) index.push_back(e.path());
  ASSERT_EQ(index.size(), 1u);
  fs::remove(index[0]);
  ASSERT_EQ(mkfifo(index[0].c_str(), 0600), 0);
  EXPECT_TRUE(compile_model_cpu(model, {x}, options(dir + "/cache")).entry_hit);   // returns: no wait for a writer
  fs::remove(index[0]);
  fs::create_symlink("/dev/zero", index[0]);
  EXPECT_TRUE(compile_model_cpu(model, {x}, options(dir + "/cache")).entry_hit);
  fs::remove_all(dir);
}
