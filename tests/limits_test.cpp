// Limits: input that declares more than it holds fails before anything is allocated, one limit caps
// any single allocation, and what is not a regular file is refused. Each hostile case runs in a child
// process with 1 GiB of address space more than the test process has and a 20 s alarm, so a
// regression is a failed test (bad_alloc, a signal), never a suite that swaps or hangs.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "limits_util.h"
#include "tessel/driver/compile_model.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/printer.h"
#include "tessel/support/error.h"
#include "tessel/support/limits.h"
#include "tessel/support/tensor.h"
#include "test_util.h"

using namespace tessel;
using testenv::bounded;
namespace fs = std::filesystem;

namespace {

fs::path tmp_dir() {
  fs::path d = fs::temp_directory_path() / ("tessel_limits_test_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}
// Removes the folder when the test process exits (bounded()'s children _exit and leave it alone).
struct RemoveTmpDir {
  ~RemoveTmpDir() {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("tessel_limits_test_" + std::to_string(getpid())), ec);
  }
} remove_tmp_dir;

// A model whose graph holds `tensor` as a Constant node's value (or as an initializer) and returns it.
std::string save_model(const onnx::TensorProto& tensor, bool as_initializer, const std::string& file) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("g");
  if (as_initializer) {
    *g->add_initializer() = tensor;
    g->mutable_initializer(0)->set_name("c");
  } else {
    auto* n = g->add_node();
    n->set_op_type("Constant");
    n->set_name("big");
    n->add_output("c");
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    *a->mutable_t() = tensor;
  }
  auto* out = g->add_output();
  out->set_name("c");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(tensor.data_type());
  const std::string path = (tmp_dir() / file).string();
  std::ofstream f(path, std::ios::binary);
  m.SerializeToOstream(&f);
  return path;
}

// An f32 TensorProto with `dims` and 4 bytes of raw data.
onnx::TensorProto f32_with_few_bytes(std::vector<int64_t> dims) {
  onnx::TensorProto t;
  t.set_name("c");
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(std::string(4, '\0'));
  return t;
}

void expect_error(const testenv::Outcome& o, const std::string& part) {
  EXPECT_TRUE(o.error) << o.message;
  EXPECT_NE(o.message.find(part), std::string::npos) << o.message;
}

// Restores the default allocation limit when a test that lowered it ends.
struct LimitGuard {
  explicit LimitGuard(uint64_t bytes) { set_max_alloc_bytes(bytes); }
  ~LimitGuard() { set_max_alloc_bytes(0); }
};

}  // namespace

TEST(Limits, ByteSizesParse) {
  EXPECT_EQ(parse_byte_size("1000"), 1000u);
  EXPECT_EQ(parse_byte_size("4K"), 4096u);
  EXPECT_EQ(parse_byte_size("512M"), uint64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("16GiB"), uint64_t{16} << 30);
  EXPECT_EQ(parse_byte_size("2t"), uint64_t{2} << 40);
  for (const char* bad : {"", "G", "4X", "4 G", "-1", "99999999999999999999", "20000000T"})
    EXPECT_EQ(parse_byte_size(bad), std::nullopt) << bad;
}

TEST(Limits, TensorBytesNeverOverflow) {
  EXPECT_EQ(tensor_bytes(DType::f32, {2, 3}), 24u);
  EXPECT_EQ(tensor_bytes(DType::f32, {}), 4u);
  EXPECT_EQ(tensor_bytes(DType::f32, {int64_t{1} << 62, int64_t{1} << 62, 0}), 0u);  // empty wins
  EXPECT_EQ(tensor_bytes(DType::u8, {int64_t{1} << 62, 8}), std::nullopt);
  EXPECT_EQ(tensor_bytes(DType::f64, {int64_t{1} << 61}), std::nullopt);  // the elements fit, the bytes do not
  EXPECT_EQ(tensor_bytes(DType::f32, {-1, 2}), std::nullopt);
}

TEST(Limits, OneLimitCapsEveryTensorAndNamesIt) {
  LimitGuard limit(1 << 20);
  EXPECT_EQ(max_alloc_bytes(), 1u << 20);
  Tensor ok(DType::f32, {1 << 18});  // exactly the limit
  try {
    Tensor t(DType::f32, {1 << 18, 2});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "a tensor of shape [262144,2] and dtype f32 needs 2097152 bytes, over the allocation limit of 1048576 "
                 "bytes (set TESSEL_MAX_ALLOC_BYTES or --max-alloc to change it)");
  }
}

TEST(Limits, DefaultLimitIsSaneForTheMachine) {
  const uint64_t phys = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  if (getenv("TESSEL_MAX_ALLOC_BYTES")) GTEST_SKIP() << "TESSEL_MAX_ALLOC_BYTES is set";
  EXPECT_EQ(max_alloc_bytes(), std::min(uint64_t{16} << 30, phys));
}

// A Constant node declaring 2^31 f32 elements over 4 bytes of raw data zero-filled 8 GiB (30-60 s)
// before the length check failed.
TEST(Limits, OnnxConstantDeclaringMoreThanItHoldsFailsAtOnce) {
  const std::string path = save_model(f32_with_few_bytes({int64_t{1} << 31}), false, "const_raw.onnx");
  expect_error(bounded([&] { import_onnx(path); }), "node 'big' (Constant): tensor 'c': raw data has 4 bytes, expected 8589934592");
  onnx::TensorProto typed;
  typed.set_name("c");
  typed.set_data_type(onnx::TensorProto::FLOAT);
  typed.add_dims(1000000000);
  typed.add_float_data(1.5f);
  const std::string p2 = save_model(typed, false, "const_typed.onnx");
  expect_error(bounded([&] { import_onnx(p2); }), "tensor 'c': has 1 values, its shape [1000000000] needs 1000000000");
}

TEST(Limits, OnnxInitializerDeclaringMoreThanItHoldsFailsAtOnce) {
  const std::string path = save_model(f32_with_few_bytes({int64_t{1} << 31}), true, "init_raw.onnx");
  expect_error(bounded([&] { import_onnx(path); }), "raw data has 4 bytes, expected 8589934592");
  // Dims whose byte count does not fit 64 bits.
  const std::string p2 = save_model(f32_with_few_bytes({int64_t{1} << 40, int64_t{1} << 40}), true, "init_huge.onnx");
  expect_error(bounded([&] { import_onnx(p2); }), "more bytes than 64-bit arithmetic can count");
}

// Declared dims over the limit are refused by name even when the data would be there.
TEST(Limits, OnnxTensorOverTheLimitNamesTheNode) {
  const std::string path = save_model(f32_with_few_bytes({1 << 20}), false, "over.onnx");
  LimitGuard limit(1 << 20);
  expect_error(bounded([&] { import_onnx(path); }),
               "node 'big' (Constant): tensor 'c' of shape [1048576] and dtype f32 needs 4194304 bytes, over the "
               "allocation limit of 1048576 bytes");
}

TEST(Limits, TensorFileDeclaringMoreThanItHoldsFailsAtOnce) {
  const std::string path = (tmp_dir() / "input_0.pb").string();
  {
    std::ofstream f(path, std::ios::binary);
    f32_with_few_bytes({int64_t{1} << 31}).SerializeToOstream(&f);
  }
  expect_error(bounded([&] { read_tensor_pb(path); }), "input_0.pb: [read] tensor 'c': raw data has 4 bytes, expected 8589934592");
}

// External data: a length far beyond the file, a file too short for the dims, a device as the file.
TEST(Limits, ExternalDataIsCheckedBeforeReading) {
  const fs::path dir = tmp_dir();
  std::ofstream(dir / "w.bin", std::ios::binary) << std::string(12, '\0');
  auto external = [&](std::vector<int64_t> dims, const std::string& location, const std::string& length) {
    onnx::TensorProto t;
    t.set_name("c");
    t.set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t.add_dims(d);
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    auto* kv = t.add_external_data();
    kv->set_key("location");
    kv->set_value(location);
    if (!length.empty()) {
      auto* l = t.add_external_data();
      l->set_key("length");
      l->set_value(length);
    }
    return save_model(t, true, "ext.onnx");
  };
  std::string p = external({3}, "w.bin", "1000000000000");
  expect_error(bounded([&] { import_onnx(p); }), "external data length is 1000000000000 bytes, expected 12");
  p = external({int64_t{1} << 30}, "w.bin", "");
  expect_error(bounded([&] { import_onnx(p); }), "is too short (12 bytes; 4294967296 needed at offset 0)");
  p = external({1 << 20}, "/dev/zero", "");
  expect_error(bounded([&] { import_onnx(p); }), "external data location '/dev/zero' must be a path relative to the model's folder");
  // Confined to the model's folder (the ONNX checker's rule): no absolute paths, no '..', no link out.
  p = external({3}, "../w.bin", "");
  expect_error(bounded([&] { import_onnx(p); }), "must not leave the model's folder ('..')");
  fs::create_symlink("/etc/passwd", dir / "link.bin");
  p = external({3}, "link.bin", "");
  expect_error(bounded([&] { import_onnx(p); }), "external data location 'link.bin' resolves outside the model's folder");
  ASSERT_EQ(mkfifo((dir / "fifo.bin").c_str(), 0600), 0);
  p = external({3}, "fifo.bin", "");
  expect_error(bounded([&] { import_onnx(p); }), "fifo.bin: is a FIFO (pipe); expected a regular external data file");
  p = external({3}, "w.bin", "twelve");
  expect_error(bounded([&] { import_onnx(p); }), "external data length 'twelve' is not a non-negative integer");
  p = external({3}, "w.bin", "");
  EXPECT_EQ(bounded([&] { import_onnx(p); }).message, "no error");
  // A file of external data larger than the limit is fine: each tensor's span is checked on its own.
  std::ofstream(dir / "w.bin", std::ios::binary) << std::string(4096, '\0');
  LimitGuard limit(1024);
  EXPECT_EQ(bounded([&] { import_onnx(p); }).message, "no error");
}

// /dev/zero as a model read forever (4 GB and growing); a FIFO blocked in open() until a writer came.
TEST(Limits, NonRegularFilesAreRefused) {
  const fs::path fifo = tmp_dir() / "fifo.onnx";
  const fs::path fifo_tsl = tmp_dir() / "fifo.tsl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  ASSERT_EQ(mkfifo(fifo_tsl.c_str(), 0600), 0) << std::strerror(errno);
  expect_error(bounded([] { import_onnx("/dev/zero"); }), "/dev/zero: [import] is a character device; expected a file");
  expect_error(bounded([&] { import_onnx(fifo.string()); }), "is a FIFO (pipe); expected a file");
  expect_error(bounded([] { read_tensor_pb("/dev/zero"); }), "/dev/zero: [read] is a character device");
  expect_error(bounded([&] { import_model_file(fifo_tsl.string()); }), "fifo.tsl: is a FIFO (pipe); expected a regular model file");
  expect_error(bounded([] { read_regular_file("/dev/zero", "model file"); }), "is a character device");
  expect_error(bounded([] { read_regular_file("/", "model file"); }), "/: is a directory; expected a regular model file");
}

TEST(Limits, FilesOverTheLimitAreRefusedBeforeReading) {
  const fs::path big = tmp_dir() / "big.onnx";
  {
    std::ofstream f(big, std::ios::binary);
    f << std::string(4096, 'x');
  }
  LimitGuard limit(1024);
  expect_error(bounded([&] { import_onnx(big.string()); }), "reading the file needs 4096 bytes, over the allocation limit of 1024 bytes");
  expect_error(bounded([&] { read_regular_file(big.string(), "model file"); }), "reading the model file needs 4096 bytes");
}

// .tsl constants: a literal of 10^9 elements given one zero-filled 4 GB first; a blob placeholder
// was allocated at its declared size before the blobs section was read.
TEST(Limits, TextConstantsDeclaringMoreThanTheTextHoldsFailAtOnce) {
  expect_error(bounded([] { parse_graph("graph @g() {\n  const %c: f32[1000000000] = [1.0]\n  return %c\n}\n", "big.tsl"); }),
               "big.tsl:2:31: [parse] f32[1000000000] declares 1000000000 elements but the rest of the text holds at most");
  expect_error(bounded([] {
                 parse_graph("graph @g() {\n  const %c: f32[2147483648] = blob<0>\n  return %c\n}\nblobs {\n  0: \"AAAAAA==\"\n}\n",
                             "blob.tsl");
               }),
               "blob.tsl:6:6: [parse] blob 0 has 4 bytes but f32[2147483648] needs 8589934592");
  expect_error(bounded([] { parse_graph("graph @g() {\n  const %c: u8[4611686018427387904,8] = [1]\n  return %c\n}\n", "o.tsl"); }),
               "o.tsl:2:");
  // Small constants still parse.
  EXPECT_EQ(bounded([] { parse_graph("graph @g() {\n  const %c: f32[2] = blob<0>\n  return %c\n}\nblobs {\n  0: \"AAAAAAAAAAA=\"\n}\n"); })
                .message,
            "no error");
}

// Shape inference: a value whose type needs more than the limit is an error before any backend
// plans or makes a buffer for it.
TEST(Limits, InferredShapesOverTheLimitAreErrors) {
  const std::string text =
      "graph @g(%x: f32[1]) {\n  const %s: i64[2] = [131072, 65536]\n  %y: f32[131072,65536] = Expand(%x, %s) "
      "loc(\"grow\")\n  return %y\n}\n";
  const fs::path p = tmp_dir() / "expand.tsl";
  std::ofstream(p) << text;
  expect_error(bounded([&] { import_model_file(p.string()); }),
               "node 'grow' (Expand): output '%y' of shape [131072,65536] and dtype f32 needs 34359738368 bytes, over "
               "the allocation limit");
}
