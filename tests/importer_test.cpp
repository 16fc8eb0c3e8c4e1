// ONNX importer: good models built in the test, and bad input that must give one clear error.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "tessel/frontend/onnx/importer.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "test_util.h"

using tessel::testenv::source_dir;

using namespace tessel;
namespace fs = std::filesystem;

namespace {

fs::path tmp_dir() {
  fs::path d = fs::temp_directory_path() / ("tessel_importer_test_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

onnx::ModelProto base_model(int opset = 17) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_domain("");
  o->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(1);
  tt->mutable_shape()->add_dim()->set_dim_value(2);
  tt->mutable_shape()->add_dim()->set_dim_param("n");
  return m;
}

void add_output(onnx::ModelProto& m, const std::string& name) {
  auto* out = m.mutable_graph()->add_output();
  out->set_name(name);
  out->mutable_type()->mutable_tensor_type()->set_elem_type(1);
}

onnx::NodeProto* add_node(onnx::ModelProto& m, const std::string& op, const std::string& name,
                          std::vector<std::string> ins, std::vector<std::string> outs) {
  auto* n = m.mutable_graph()->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (auto& i : ins) n->add_input(i);
  for (auto& o : outs) n->add_output(o);
  return n;
}

std::string save(const onnx::ModelProto& m, const std::string& file) {
  fs::path p = tmp_dir() / file;
  std::ofstream f(p, std::ios::binary);
  m.SerializeToOstream(&f);
  return p.string();
}

std::string import_error(const std::string& path, bool* is_unsupported = nullptr) {
  try {
    ImportOptions o;
    o.input_shapes = {Shape{2, 3}};
    import_onnx(path, o);
  } catch (const Error& e) {
    if (is_unsupported) *is_unsupported = e.is_unsupported();
    return e.what();
  }
  ADD_FAILURE() << "no error importing " << path;
  return "";
}

}  // namespace

TEST(Importer, ExternalDataAndSymbolicDims) {
  onnx::ModelProto m = base_model();
  auto* w = m.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(1);
  w->add_dims(3);
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = w->add_external_data();
  kv->set_key("location");
  kv->set_value("weights.bin");
  auto* kv2 = w->add_external_data();
  kv2->set_key("offset");
  kv2->set_value("4");
  float data[4] = {99, 1.5f, -2, 4};
  std::ofstream(tmp_dir() / "weights.bin", std::ios::binary).write(reinterpret_cast<char*>(data), sizeof data);
  add_node(m, "Add", "add0", {"x", "w"}, {"y"});
  add_output(m, "y");
  ImportOptions o;
  o.input_shapes = {Shape{2, 3}};
  ImportedModel im = import_onnx(save(m, "ext.onnx"), o);
  EXPECT_EQ(im.graph->inputs[0]->type.str(), "f32[2,3]");  // the symbolic dim bound by the given shape
  std::vector<double> xv = {0, 0, 0, 1, 1, 1};
  auto out = run_eager(*im.graph, {Tensor::from_f64(DType::f32, {2, 3}, xv)});
  EXPECT_EQ(out[0].to_f64(), (std::vector<double>{1.5, -2, 4, 2.5, -1, 5}));
}

TEST(Importer, TruncatedAndCorruptFiles) {
  std::string src = source_dir() + "/examples/tblock_s/model.onnx";
  std::string bytes = tessel::testenv::read_text(src);
  fs::path trunc = tmp_dir() / "truncated.onnx";
  std::ofstream(trunc, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  std::string e = import_error(trunc.string());
  EXPECT_NE(e.find(trunc.string()), std::string::npos) << e;
  EXPECT_NE(e.find("truncated or corrupt"), std::string::npos) << e;

  fs::path junk = tmp_dir() / "junk.onnx";
  std::ofstream(junk, std::ios::binary) << std::string("\xff\xff\xff\xff this is not a model", 25);
  e = import_error(junk.string());
  EXPECT_NE(e.find("junk.onnx"), std::string::npos) << e;

  e = import_error((tmp_dir() / "does_not_exist.onnx").string());
  EXPECT_NE(e.find("cannot open file"), std::string::npos) << e;
}

TEST(Importer, MissingInitializerNamesTheNode) {
  onnx::ModelProto m = base_model();
  add_node(m, "Add", "/layer/add", {"x", "weight_that_is_missing"}, {"y"});
  add_output(m, "y");
  std::string e = import_error(save(m, "missing.onnx"));
  EXPECT_NE(e.find("missing.onnx: [import] node '/layer/add' (Add): uses undefined value 'weight_that_is_missing'"),
            std::string::npos)
      << e;
}

TEST(Importer, UnknownOpsAreListedTogether) {
  onnx::ModelProto m = base_model();
  add_node(m, "Frobnicate", "f1", {"x"}, {"a"});
  add_node(m, "Frobnicate", "f2", {"a"}, {"b"});
  add_node(m, "Zap", "z1", {"b"}, {"y"});
  add_output(m, "y");
  bool unsup = false;
  std::string e = import_error(save(m, "unknown.onnx"), &unsup);
  EXPECT_TRUE(unsup);
  EXPECT_NE(e.find("unsupported ops: Frobnicate (nodes 'f1', 'f2'); Zap (node 'z1')"), std::string::npos) << e;
}

TEST(Importer, UnsupportedDtypeAndAttribute) {
  onnx::ModelProto m = base_model();
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(8);  // string
  add_node(m, "Add", "a", {"x", "x"}, {"y"});
  add_output(m, "y");
  bool unsup = false;
  std::string e = import_error(save(m, "string.onnx"), &unsup);
  EXPECT_TRUE(unsup);
  EXPECT_NE(e.find("unsupported data type string"), std::string::npos) << e;

  onnx::ModelProto m2 = base_model();
  auto* n = add_node(m2, "Add", "with_attr", {"x", "x"}, {"y"});
  auto* a = n->add_attribute();
  a->set_name("bogus");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(1);
  add_output(m2, "y");
  e = import_error(save(m2, "attr.onnx"));
  EXPECT_NE(e.find("node 'with_attr' (Add): unsupported attribute 'bogus'"), std::string::npos) << e;
}

TEST(Importer, DeclaredInputShapeMismatch) {
  onnx::ModelProto m = base_model();
  add_node(m, "Add", "a", {"x", "x"}, {"y"});
  add_output(m, "y");
  try {
    ImportOptions o;
    o.input_shapes = {Shape{5, 3}};
    import_onnx(save(m, "shape.onnx"), o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("graph input 'x' is declared f32[2,?] but was given shape [5,3]"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorFiles, RoundTrip) {
  std::vector<double> v = {1, -2.5, 3};
  Tensor t = Tensor::from_f64(DType::bf16, {3}, v);
  std::string p = (tmp_dir() / "t.pb").string();
  write_tensor_pb(t, "t", p);
  EXPECT_TRUE(read_tensor_pb(p).same_as(t));
  Tensor i4 = Tensor::from_i64(DType::i4, {3}, std::vector<int64_t>{-8, 7, -1});
  write_tensor_pb(i4, "i4", p);
  Tensor back = read_tensor_pb(p);
  EXPECT_EQ(back.to_i64(), (std::vector<int64_t>{-8, 7, -1}));
}

TEST(TensorFiles, TwoBitPackingAndE8M0) {
  std::string p = (tmp_dir() / "t2.pb").string();
  // Five int2 values pack four to a byte, lowest bits first: -2,1,0,-1 -> 0b11'00'01'10 = 0xC6,
  // then 1 -> 0x01.
  Tensor i2 = Tensor::from_i64(DType::i2, {5}, std::vector<int64_t>{-2, 1, 0, -1, 1});
  write_tensor_pb(i2, "i2", p);
  {
    onnx::TensorProto tp;
    std::ifstream f(p, std::ios::binary);
    ASSERT_TRUE(tp.ParseFromIstream(&f));
    EXPECT_EQ(tp.data_type(), 26);
    EXPECT_EQ(tp.raw_data(), std::string("\xC6\x01", 2));
  }
  EXPECT_TRUE(read_tensor_pb(p).same_as(i2));
  EXPECT_EQ(read_tensor_pb(p).to_i64(), (std::vector<int64_t>{-2, 1, 0, -1, 1}));
  Tensor u2 = Tensor::from_i64(DType::u2, {2, 2}, std::vector<int64_t>{3, 0, 2, 1});
  write_tensor_pb(u2, "u2", p);
  EXPECT_EQ(read_tensor_pb(p).to_i64(), (std::vector<int64_t>{3, 0, 2, 1}));

  // int32_data holds one packed byte per entry: 228 = 0b11'10'01'00 -> uint2 0, 1, 2, 3.
  onnx::TensorProto tp;
  tp.set_data_type(25);
  tp.add_dims(4);
  tp.add_int32_data(228);
  {
    std::ofstream f(p, std::ios::binary);
    tp.SerializeToOstream(&f);
  }
  EXPECT_EQ(read_tensor_pb(p).to_i64(), (std::vector<int64_t>{0, 1, 2, 3}));
  // A wrong count of packed entries is an error, not a crash.
  tp.add_int32_data(0);
  tp.add_int32_data(0);
  {
    std::ofstream f(p, std::ios::binary);
    tp.SerializeToOstream(&f);
  }
  EXPECT_THROW(read_tensor_pb(p), Error);

  // float8e8m0: one byte per element.
  Tensor e = Tensor::from_f64(DType::f8e8m0, {3}, std::vector<double>{1, 0.125, 256});
  write_tensor_pb(e, "e", p);
  Tensor eb = read_tensor_pb(p);
  EXPECT_EQ(eb.dtype(), DType::f8e8m0);
  EXPECT_EQ(eb.to_f64(), (std::vector<double>{1, 0.125, 256}));
  EXPECT_EQ(eb.bytes()[2], 0x87);
}

// issue 41: an opset version the ONNX checker refuses (0, negative) or one that does not fit an int (it was
// truncated: 2^32 + 13 read as opset 13) is an error naming the domain, not a model run at another opset.
TEST(Importer, OpsetVersionsOutsideTheRangeAreRefused) {
  for (int64_t v : {int64_t{0}, int64_t{-5}, (int64_t{1} << 32) + 13}) {
    onnx::ModelProto m = base_model();
    m.mutable_opset_import(0)->set_version(v);
    add_node(m, "Relu", "relu", {"x"}, {"y"});
    add_output(m, "y");
    std::string e = import_error(save(m, "opset.onnx"));
    EXPECT_NE(e.find(fmt::format("opset_import of domain 'ai.onnx' has version {}: not an opset version", v)), std::string::npos)
        << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

// issue 41: a tensor of more than kMaxRank (64) dims is an error naming the value or node -- a Reshape to
// 100 000 ones once made fusion (quadratic in the rank) run for minutes -- and a rank of 64 still imports.
TEST(Importer, RanksOverTheLimitAreRefused) {
  auto reshape_to = [](int rank) {
    onnx::ModelProto m = base_model();
    auto* s = m.mutable_graph()->add_initializer();
    s->set_name("shape");
    s->set_data_type(7);  // int64
    s->add_dims(rank);
    for (int i = 0; i < rank; ++i) s->add_int64_data(i == 0 ? 6 : 1);
    add_node(m, "Reshape", "/big/Reshape", {"x", "shape"}, {"y"});
    add_output(m, "y");
    return m;
  };
  std::string e = import_error(save(reshape_to(100000), "rank.onnx"));
  EXPECT_NE(e.find("/big/Reshape"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 100000, over tessel's limit of 64"), std::string::npos) << e;
  ImportOptions o;
  o.input_shapes = {Shape{2, 3}};
  EXPECT_EQ(import_onnx(save(reshape_to(64), "rank64.onnx"), o).graph->outputs[0]->type.shape.size(), 64u);
  onnx::ModelProto wide = base_model();
  auto* d = wide.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  for (int i = 0; i < 70; ++i) d->add_dim()->set_dim_value(1);
  add_node(wide, "Relu", "relu", {"x"}, {"y"});
  add_output(wide, "y");
  e = import_error(save(wide, "wide.onnx"));
  EXPECT_NE(e.find("value 'x' has 72 dims, over tessel's rank limit of 64"), std::string::npos) << e;
}
