// KTIR export (docs/ktir.md): the ffn_s module checked structurally against its tile program, and
// other corpus models exported with their skipped kernels named.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "corpus_util.h"
#include "tessel/driver/dataflow.h"
#include "tessel/driver/model_dir.h"
#include "tessel/hw/hw.h"
#include "tessel/export/ktir.h"
#include "tessel/targets/dataflow/functional.h"

using namespace tessel;

namespace {

DataflowCompile compile_spyre(const std::string& model) {
  testenv::CorpusCase c = testenv::load_corpus_model(model);
  ModelPaths mp = resolve_model(testenv::shared_dir() + "/models/" + model);
  return compile_dataflow(mp.model, c.inputs, hw::load_preset("spyre"));
}

std::string join(const std::vector<int64_t>& v, const char* sep) {
  std::string r;
  for (size_t i = 0; i < v.size(); ++i) r += (i ? sep : "") + std::to_string(v[i]);
  return r;
}

// The functions of a module: name -> text (from "func.func @name(" to its closing "  }").
std::map<std::string, std::string> functions(const std::string& text) {
  std::map<std::string, std::string> f;
  std::istringstream in(text);
  std::string line, name, body;
  while (std::getline(in, line)) {
    static const std::regex head(R"(^\s*func\.func @([A-Za-z0-9_]+)\()");
    std::smatch mt;
    if (std::regex_search(line, mt, head)) name = mt[1], body.clear();
    if (!name.empty()) body += line + "\n";
    if (!name.empty() && line == "  }") f[name] = body, name.clear();
  }
  return f;
}

// Every %value a function uses is defined before, in an enclosing region: function arguments,
// results (left of '='), scf.for induction variables and iter_args. Region results become visible
// when their region closes. Returns the first violation, or "".
std::string check_ssa(const std::string& func) {
  static const std::regex value(R"(%[A-Za-z0-9_$.]+)");
  static const std::regex lhs(R"(^\s*(%[A-Za-z0-9_$.]+(?:\s*,\s*%[A-Za-z0-9_$.]+)*)\s*=\s)");
  static const std::regex region_def(R"((?:scf\.for\s+|iter_args\(\s*|,\s*)(%[A-Za-z0-9_$.]+)\s*=)");
  static const std::regex arg(R"(^\s*(%[A-Za-z0-9_]+): )");
  struct Scope {
    std::set<std::string> defined, on_close;
  };
  std::vector<Scope> scopes(1);
  auto visible = [&](const std::string& v) {
    for (const Scope& s : scopes)
      if (s.defined.count(v)) return true;
    return false;
  };
  std::istringstream in(func);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const auto cpos = line.find("//");
    std::string code = cpos == std::string::npos ? line : line.substr(0, cpos);
    std::smatch m;
    if (std::regex_search(code, m, arg)) {
      scopes.back().defined.insert(m[1]);
      continue;
    }
    if (code.find("^bb0(") != std::string::npos) {  // a region's block arguments
      static const std::regex block_arg(R"((%[A-Za-z0-9_]+):)");
      for (std::sregex_iterator it(code.begin(), code.end(), block_arg), end; it != end; ++it) scopes.back().defined.insert((*it)[1]);
      continue;
    }
    std::set<std::string> results, region_vals;
    std::string rest = code;
    if (std::regex_search(code, m, lhs)) {
      std::string l = m[1];
      for (std::sregex_iterator it(l.begin(), l.end(), value), end; it != end; ++it) results.insert(it->str());
      rest = m.suffix();
    }
    for (std::sregex_iterator it(rest.begin(), rest.end(), region_def), end; it != end; ++it) region_vals.insert((*it)[1]);
    for (std::sregex_iterator it(rest.begin(), rest.end(), value), end; it != end; ++it) {
      const std::string v = it->str();
      if (region_vals.count(v)) continue;
      if (!visible(v)) return fmt::format("line {}: {} used before its definition: {}", n, v, line);
    }
    for (const std::string& v : results)
      if (visible(v)) return fmt::format("line {}: {} defined twice", n, v);
    int opens = 0, closes = 0;
    for (char c : code) opens += c == '{', closes += c == '}';
    const bool opens_region = !code.empty() && code.find_last_not_of(" ") != std::string::npos &&
                              code[code.find_last_not_of(" ")] == '{' && opens > closes;
    const bool closes_region = code.find_first_not_of(" ") != std::string::npos && code[code.find_first_not_of(" ")] == '}' &&
                               closes > opens;
    if (closes_region) {
      if (scopes.size() < 2) return fmt::format("line {}: unbalanced '}}'", n);
      Scope s = scopes.back();
      scopes.pop_back();
      scopes.back().defined.insert(s.on_close.begin(), s.on_close.end());
    }
    if (opens_region) {
      // the op's results become visible in the enclosing scope when this region closes
      scopes.emplace_back();
      scopes.back().defined.insert(region_vals.begin(), region_vals.end());
      scopes.back().on_close.insert(results.begin(), results.end());
    } else {
      scopes.back().defined.insert(results.begin(), results.end());
    }
  }
  return scopes.size() == 1 ? "" : "unclosed region";
}

// Op names used in a module: the token after "= " or the first token of a statement.
std::set<std::string> op_names(const std::string& text) {
  std::set<std::string> ops;
  std::istringstream in(text);
  std::string line;
  static const std::regex after_eq(R"(^\s*%[^=]*=\s*([a-z_]+\.[a-z_]+))");
  static const std::regex stmt(R"(^\s*([a-z_]+\.[a-z_]+|return)\b)");
  while (std::getline(in, line)) {
    const auto cpos = line.find("//");
    const std::string code = cpos == std::string::npos ? line : line.substr(0, cpos);
    std::smatch m;
    if (std::regex_search(code, m, after_eq) || std::regex_search(code, m, stmt)) ops.insert(m[1]);
  }
  return ops;
}

bool balanced(const std::string& text) {
  std::vector<char> st;
  bool in_comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') in_comment = false;
    if (in_comment) continue;
    if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      in_comment = true;
      continue;
    }
    if (c == '{' || c == '(' || c == '[' || c == '<') st.push_back(c);
    if (c == '>' && i > 0 && text[i - 1] == '-') continue;  // "->"
    if (c == '>' && i > 0 && text[i - 1] == ' ' && i + 1 < text.size() && text[i + 1] == '=') continue;  // ">="
    if (c == '}' || c == ')' || c == ']' || c == '>') {
      const char want = c == '}' ? '{' : c == ')' ? '(' : c == ']' ? '[' : '<';
      if (st.empty() || st.back() != want) return false;
      st.pop_back();
    }
  }
  return st.empty();
}

const std::set<std::string>& known_ops() {
  static const std::set<std::string> s = {
      "ktdp.get_compute_tile_id", "ktdp.construct_memory_view", "ktdp.construct_access_tile", "ktdp.load", "ktdp.store",
      "arith.constant", "arith.muli", "arith.addi", "arith.subi", "arith.addf", "arith.subf", "arith.mulf", "arith.divf",
      "arith.remf", "arith.negf", "arith.maximumf", "arith.minimumf", "arith.maxsi", "arith.minsi", "arith.divsi", "arith.remsi", "arith.andi", "arith.ori",
      "arith.xori", "arith.cmpf", "arith.cmpi", "arith.select", "arith.extf", "arith.truncf", "arith.sitofp", "arith.uitofp",
      "arith.fptosi", "arith.extsi", "arith.extui", "arith.trunci", "math.exp", "math.log", "math.sqrt", "math.sin",
      "math.atan", "math.erf", "math.tanh", "math.floor", "math.roundeven", "math.powf", "linalg.matmul", "linalg.fill",
      "linalg.broadcast", "linalg.reduce", "tensor.empty", "tensor.collapse_shape", "tensor.expand_shape",
      "tensor.extract", "tensor.splat", "tensor.insert_slice", "tensor.extract_slice", "scf.for", "scf.if", "scf.yield", "func.func", "return"};
  return s;
}

// The program's last matmul tile kernel (the ksplit examples have one), or null.
const tile::TileKernel* last_matmul(const tile::TileProgram& p) {
  const tile::TileKernel* mm = nullptr;
  for (const tile::TileKernel& t : p.kernels)
    if (t.kind == tile::TileKind::matmul) mm = &t;
  return mm;
}

}  // namespace

TEST(KtirChecker, CatchesUndefinedValuesAndRegions) {
  EXPECT_EQ(check_ssa("  func.func @f(\n      %arg0: index\n  ) attributes {grid = [1]} {\n    %a = arith.addi %arg0, %arg0 : index\n"
                      "    return\n  }\n"),
            "");
  EXPECT_NE(check_ssa("  func.func @f(\n  ) attributes {grid = [1]} {\n    %a = arith.addi %b, %b : index\n    return\n  }\n"), "");
  // a value defined inside a loop is not visible after it
  EXPECT_NE(check_ssa("  func.func @f(\n  ) attributes {grid = [1]} {\n    %c = arith.constant 1 : index\n"
                      "    scf.for %i = %c to %c step %c {\n      %x = arith.addi %i, %c : index\n      scf.yield\n    }\n"
                      "    %y = arith.addi %x, %c : index\n    return\n  }\n"),
            "");
  EXPECT_FALSE(balanced("a { b ( c ] }"));
  EXPECT_TRUE(balanced("affine_set<(d0) : (d0 >= 0)> -> tensor<4xf16>"));
}

TEST(Ktir, FfnSStructure) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  DataflowCompile dc = compile_spyre("ffn_s");
  const tile::TileProgram& p = dc.program;
  std::vector<std::string> skipped;
  const std::string text = ktir::export_ktir(p, dc.module, &skipped);
  EXPECT_TRUE(skipped.empty()) << fmt::format("{}", fmt::join(skipped, "; "));
  EXPECT_TRUE(balanced(text)) << text;
  const auto funcs = functions(text);
  ASSERT_EQ(funcs.size(), p.kernels.size());
  for (const std::string& op : op_names(text)) EXPECT_TRUE(known_ops().count(op)) << "unknown op " << op;
  for (const tile::TileKernel& t : p.kernels) {
    SCOPED_TRACE(t.name);
    ASSERT_EQ(t.kind, tile::TileKind::matmul);
    ASSERT_TRUE(funcs.count(t.name));
    const std::string& f = funcs.at(t.name);
    EXPECT_EQ(check_ssa(f), "");
    // the grid is the split dims
    std::vector<int64_t> splits;
    std::map<std::string, int64_t> tile;
    for (const tile::Dim& d : t.dims) {
      if (d.split > 1) splits.push_back(d.split);
      tile[d.name] = d.tile;
    }
    if (splits.empty()) splits = {1};
    EXPECT_NE(f.find(fmt::format("attributes {{grid = [{}]}}", join(splits, ", "))), std::string::npos);
    EXPECT_NE(f.find("ktdp.get_compute_tile_id"), std::string::npos);
    EXPECT_NE(text.find(fmt::format("// {}: matmul kernel k{} of node \"{}\"", t.name, t.kernel, t.node)), std::string::npos);
    // every operand's global has a memory view in its padded layout
    int loads = 0, stores = 0;
    for (const tile::Operand& op : t.operands) {
      if (op.global < 0) continue;
      const tile::Global& g = p.globals[static_cast<size_t>(op.global)];
      EXPECT_NE(f.find(fmt::format("sizes: [{}], strides:", join(g.padded, ", "))), std::string::npos) << g.name;
      EXPECT_NE(f.find(fmt::format("memref<{}x{}>", join(g.padded, "x"), dtype_name(g.dtype))), std::string::npos) << g.name;
      (op.out ? stores : loads)++;
    }
    auto count = [&](const std::string& s) {
      int n = 0;
      for (size_t at = f.find(s); at != std::string::npos; at = f.find(s, at + 1)) ++n;
      return n;
    };
    // one tile load per input operand (k is one tile: no k loop), one store per output
    EXPECT_EQ(count("= ktdp.load "), loads);
    EXPECT_EQ(count("ktdp.store "), stores);
    const int64_t tm = tile["m"], tn = tile["n"], tk = tile["k"];
    EXPECT_NE(f.find(fmt::format("-> tensor<{}x{}xf16>", tm, tk)), std::string::npos);  // A
    EXPECT_NE(f.find(fmt::format("-> tensor<{}x{}xf16>", tk, tn)), std::string::npos);  // B
    EXPECT_NE(f.find(fmt::format("-> tensor<{}xf16>", tn)), std::string::npos);          // the bias row
    EXPECT_NE(f.find(fmt::format(": tensor<{}x{}xf16>, !ktdp.access_tile<{}x{}xindex>", tm, tn, tm, tn)), std::string::npos);
    EXPECT_NE(f.find(fmt::format("linalg.matmul ins(")), std::string::npos);
    EXPECT_NE(f.find(fmt::format("outs(%acc0 : tensor<{}x{}xf32>)", tm, tn)), std::string::npos);
  }
  // the first layer's epilogue is GELU in its erf form
  EXPECT_NE(funcs.at("t0").find("math.erf"), std::string::npos);
}

TEST(Ktir, AttentionAndBlockExportWithSkippedNamed) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  for (const char* model : {"tblock_s", "attn_s", "gpt2_tiny"}) {
    SCOPED_TRACE(model);
    DataflowCompile dc = compile_spyre(model);
    std::vector<std::string> skipped;
    const std::string text = ktir::export_ktir(dc.program, dc.module, &skipped);
    EXPECT_TRUE(balanced(text));
    const auto funcs = functions(text);
    EXPECT_EQ(funcs.size() + skipped.size(), dc.program.kernels.size());
    for (const auto& [name, f] : funcs) EXPECT_EQ(check_ssa(f), "") << name;
    for (const std::string& op : op_names(text)) EXPECT_TRUE(known_ops().count(op)) << "unknown op " << op;
    for (const std::string& s : skipped) EXPECT_NE(text.find("// skipped " + s), std::string::npos) << s;
    for (const tile::TileKernel& t : dc.program.kernels)
      if (t.kind == tile::TileKind::host) {
        EXPECT_TRUE(std::any_of(skipped.begin(), skipped.end(), [&](const std::string& s) { return s.rfind(t.name + ": host", 0) == 0; }))
            << t.name;
      }
    if (std::string(model) != "gpt2_tiny") {
      // every kernel, the re-layout copy of attention's Kᵀ included
      EXPECT_TRUE(skipped.empty()) << fmt::format("{}", fmt::join(skipped, "; "));
      // layer norm / softmax: row reductions and broadcasts
      EXPECT_NE(text.find("linalg.reduce { arith.addf }"), std::string::npos);
    } else {
      // only the host steps (the embedding gathers): partial tiles, views affine per head and row stores are exported
      for (const std::string& s : skipped) EXPECT_NE(s.find(": host step"), std::string::npos) << s;
      EXPECT_NE(text.find("scf.if"), std::string::npos);          // a short last slice
      EXPECT_NE(text.find("arith.remsi"), std::string::npos);     // a view split per head
    }
  }
}

// The folder form ktir-cpu reads: one module per exported kernel (ktir-cpu runs one function per
// module), each the same function as in the one-file form, and a manifest naming every argument's
// global in order. bench/ktir_check.py runs these files on ktir-cpu itself.
TEST(Ktir, OneModulePerKernelWithAManifest) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  DataflowCompile dc = compile_spyre("tblock_s");
  const tile::TileProgram& p = dc.program;
  const ktir::KtirExport e = ktir::export_ktir_kernels(p, dc.module);
  std::vector<std::string> skipped;
  const std::string one_file = ktir::export_ktir(p, dc.module, &skipped);
  EXPECT_EQ(e.skipped, skipped);
  EXPECT_EQ(e.kernels.size() + e.skipped.size(), p.kernels.size());
  ASSERT_FALSE(e.kernels.empty());
  const nlohmann::json m = ktir::ktir_manifest(p, e);
  ASSERT_EQ(m["kernels"].size(), e.kernels.size());
  EXPECT_EQ(m["skipped"].size(), e.skipped.size());
  EXPECT_EQ(m["inputs"], nlohmann::json::array({"x"}));
  for (size_t i = 0; i < e.kernels.size(); ++i) {
    const ktir::KtirKernel& k = e.kernels[i];
    SCOPED_TRACE(k.tile_kernel);
    EXPECT_TRUE(balanced(k.module)) << k.module;
    const auto funcs = functions(k.module);
    ASSERT_EQ(funcs.size(), 1u);
    EXPECT_EQ(funcs.begin()->first, k.tile_kernel);
    EXPECT_NE(one_file.find(k.func), std::string::npos);  // the same function as in the one-file form
    const nlohmann::json& mk = m["kernels"][i];
    EXPECT_EQ(mk["file"], ktir::ktir_file_name(i, k));
    EXPECT_EQ(mk["function"], k.tile_kernel);
    ASSERT_EQ(mk["args"].size(), k.args.size());
    for (size_t a = 0; a < k.args.size(); ++a) {
      const tile::Global& g = p.globals[static_cast<size_t>(k.args[a])];
      EXPECT_EQ(mk["args"][a]["global"], g.name);
      EXPECT_EQ(mk["args"][a]["arg"], fmt::format("arg{}", a));
      // the signature declares the same argument, with the global's name in its comment
      EXPECT_NE(k.func.find(fmt::format("%arg{}: index", a)), std::string::npos);
    }
    EXPECT_EQ(k.func.find(fmt::format("%arg{}: index", k.args.size())), std::string::npos);
  }
}

// Every memory view of every exported kernel, read back through its global's declaration (padded
// shape, physical order): each element it names is a real element of the global (not padding, not
// past its end), and the matmul result's view names element (b, m, n) of the result, which is the
// result value's logical element (b·M + m)·N + n whatever order it is stored in (tblock_s's
// /MatMul_1 writes the heads into the merged [T, H·D] layout: its declaration must say so).
TEST(Ktir, DeclarationsMatchTheViews) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  int transposed = 0;
  for (const char* model : {"tblock_s", "ffn_s", "attn_s", "tblock_bert", "bert_tiny", "gpt2_tiny", "mobilenet_v2"}) {
    SCOPED_TRACE(model);
    DataflowCompile dc = compile_spyre(model);
    const tile::TileProgram& p = dc.program;
    const ktir::KtirExport e = ktir::export_ktir_kernels(p, dc.module);
    ASSERT_FALSE(e.kernels.empty());
    for (const ktir::KtirKernel& k : e.kernels) {
      SCOPED_TRACE(k.tile_kernel);
      const tile::TileKernel* t = nullptr;
      for (const tile::TileKernel& x : p.kernels)
        if (x.name == k.tile_kernel) t = &x;
      ASSERT_NE(t, nullptr);
      const Kernel* kk = t->kernel >= 0 ? &dc.module.kernels.at(static_cast<size_t>(t->kernel)) : nullptr;
      for (const ktir::KtirView& v : k.views) {
        SCOPED_TRACE(v.what);
        const tile::Global& g = p.globals.at(static_cast<size_t>(v.global));
        // the points: all of them when few, else every line through the two extreme corners
        std::vector<std::vector<int64_t>> points;
        int64_t total = 1;
        for (int64_t s : v.sizes) total *= s;
        if (total <= 65536) {
          std::vector<int64_t> q(v.sizes.size(), 0);
          for (int64_t i = 0; i < total; ++i) {
            points.push_back(q);
            for (size_t d = q.size(); d-- > 0;) {
              if (++q[d] < v.sizes[d]) break;
              q[d] = 0;
            }
          }
        } else {
          for (int corner = 0; corner < 2; ++corner)
            for (size_t d = 0; d < v.sizes.size(); ++d)
              for (int64_t i = 0; i < v.sizes[d]; ++i) {
                std::vector<int64_t> q(v.sizes.size());
                for (size_t j = 0; j < q.size(); ++j) q[j] = corner ? v.sizes[j] - 1 : 0;
                q[d] = i;
                points.push_back(q);
              }
        }
        // the matmul result: stored through a view over b m n into the kernel's c buffer
        const bool result = kk && kk->kind == KernelKind::matmul && v.stored &&
                            g.name == kk->args.at(static_cast<size_t>(kk->mm.c)).name;
        if (result) {
          ASSERT_EQ(shape_numel(g.shape), kk->mm.batch * kk->mm.m * kk->mm.n) << g.name;
          bool perm = false;
          for (size_t i = 0; i < g.perm.size(); ++i) perm = perm || g.perm[i] != static_cast<int64_t>(i);
          transposed += perm;
        }
        int bad = 0;
        for (const auto& q : points) {
          int64_t addr = v.base;
          std::map<std::string, int64_t> at;
          for (size_t d = 0; d < q.size(); ++d) addr += q[d] * v.strides[d], at[v.dims.size() > d ? v.dims[d] : "?"] = q[d];
          const int64_t l = ktir::ktir_logical_at(g, addr);
          if (l < 0) {
            if (bad++ < 3) ADD_FAILURE() << g.name << ": address " << addr << " is padding or outside the declaration";
            continue;
          }
          if (result) {
            const int64_t want = (at["b"] * kk->mm.m + at["m"]) * kk->mm.n + at["n"];
            if (l != want && bad++ < 3)
              ADD_FAILURE() << g.name << ": the result's element (" << at["b"] << ", " << at["m"] << ", " << at["n"]
                            << ") is stored at logical element " << l << ", not " << want;
          }
        }
      }
    }
  }
  EXPECT_GT(transposed, 0);  // tblock_s's heads-merging result is declared in its stored order
}

// ktir_address and ktir_logical_at invert each other on a permuted, padded global.
TEST(Ktir, DeclarationAddressRoundTrip) {
  tile::Global g;
  g.name = "x";
  g.shape = {1, 4, 5, 3};
  g.padded = {1, 4, 5, 8};
  g.perm = {0, 2, 1, 3};
  std::set<int64_t> seen;
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t d = 0; d < 3; ++d) {
        const int64_t a = ktir::ktir_address(g, {0, h, t, d});
        EXPECT_EQ(a, (t * 4 + h) * 8 + d);  // [T, H, D padded to 8]
        EXPECT_EQ(ktir::ktir_logical_at(g, a), (h * 5 + t) * 3 + d);
        seen.insert(a);
      }
  EXPECT_EQ(seen.size(), 60u);
  EXPECT_EQ(ktir::ktir_logical_at(g, 3), -1);        // padding of the first stick
  EXPECT_EQ(ktir::ktir_logical_at(g, 4 * 5 * 8), -1);  // past the end
}

// docs/ktir.md's worked example: every line of its ```mlir block is a line of tblock_s's t5 as exported.
TEST(Ktir, DocsWorkedExample) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  std::ifstream f(std::string(TESSEL_SOURCE_DIR) + "/docs/ktir.md");
  ASSERT_TRUE(f) << "docs/ktir.md";
  std::vector<std::string> lines;
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    if (line == "```mlir") in = true;
    else if (line == "```") in = false;
    else if (in) lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 5u);
  DataflowCompile dc = compile_spyre("tblock_s");
  const ktir::KtirExport e = ktir::export_ktir_kernels(dc.program, dc.module);
  const ktir::KtirKernel* t5 = nullptr;
  for (const ktir::KtirKernel& k : e.kernels)
    if (k.node == "/MatMul_1") t5 = &k;
  ASSERT_NE(t5, nullptr);
  for (const std::string& l : lines) EXPECT_NE(t5->func.find(l + "\n"), std::string::npos) << l;
  // the declaration the example shows: the heads-merged order
  const tile::Global& g = dc.program.globals.at(static_cast<size_t>(t5->args.at(2)));
  EXPECT_EQ(g.perm, (std::vector<int64_t>{0, 2, 1, 3}));
}

// docs/ktir.md's convolution example: every line of its ```mlir conv block is a line of examples/conv_kinds' t1.
TEST(Ktir, DocsConvolutionExample) {
  const std::string block = testenv::md_block(testenv::read_text(std::string(TESSEL_SOURCE_DIR) + "/docs/ktir.md"), "```mlir conv");
  ASSERT_FALSE(block.empty()) << "docs/ktir.md has no ```mlir conv block";
  ModelPaths mp = resolve_model(testenv::source_dir() + "/examples/conv_kinds");
  DataflowCompile dc = compile_dataflow(mp.model, {}, hw::load_preset("spyre"));
  const ktir::KtirExport e = ktir::export_ktir_kernels(dc.program, dc.module);
  const ktir::KtirKernel* t1 = nullptr;
  for (const ktir::KtirKernel& k : e.kernels)
    if (k.tile_kernel == "t1") t1 = &k;
  ASSERT_NE(t1, nullptr);
  std::istringstream in(block);
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) EXPECT_NE(t1->func.find(line + "\n"), std::string::npos) << line;
  EXPECT_EQ(n, 8);
}

// Every convolution kind is exported: mobilenet_v2's pointwise ones as strided views, its 3x3 convolutions
// with padding (the stem: stride 2 on 3 channels; the depthwise ones, on the vector unit) from the input rows
// loaded once per tile with the border's zeros added in the scratchpad; examples/conv_kinds adds a grouped
// (block-diagonal) and a dilated one, on tiles that end mid-row. Their values are checked by ktir_cpu_chain.
TEST(Ktir, EveryConvolutionKindExported) {
  std::vector<std::string> models = {testenv::source_dir() + "/examples/conv_kinds"};
  if (testenv::have_shared()) models.push_back(testenv::shared_dir() + "/models/mobilenet_v2");
  std::map<std::string, int> kinds;
  for (const std::string& model : models) {
    SCOPED_TRACE(model);
    ModelPaths mp = resolve_model(model);
    DataflowCompile dc = compile_dataflow(mp.model, {}, hw::load_preset("spyre"));
    const ktir::KtirExport e = ktir::export_ktir_kernels(dc.program, dc.module);
    EXPECT_TRUE(e.skipped.empty()) << fmt::format("{}", fmt::join(e.skipped, "; "));
    std::map<std::string, const ktir::KtirKernel*> by_name;
    for (const ktir::KtirKernel& k : e.kernels) by_name[k.tile_kernel] = &k;
    for (const tile::TileKernel& t : dc.program.kernels) {
      if (t.kind != tile::TileKind::conv) continue;
      SCOPED_TRACE(t.name);
      ASSERT_TRUE(by_name.count(t.name));
      const ktir::KtirKernel& k = *by_name[t.name];
      const ConvSpec& c = dc.module.kernels.at(static_cast<size_t>(t.kernel)).conv;
      EXPECT_EQ(check_ssa(k.func), "");
      EXPECT_TRUE(balanced(k.module));
      for (const std::string& op : op_names(k.module)) EXPECT_TRUE(known_ops().count(op)) << "unknown op " << op;
      const bool padded = c.pad_top || c.pad_left || c.pad_bottom || c.pad_right;
      const bool depthwise = c.groups > 1 && c.c == c.groups && c.oc == c.groups;
      // a padded convolution adds the border's zeros in the scratchpad; none is read from DRAM
      EXPECT_EQ(padded, k.func.find("%border0 = arith.constant dense<0.000000000e+00> : tensor<") != std::string::npos);
      // depthwise: multiply-adds on the vector unit, as the tile level runs it; the rest: matmuls
      EXPECT_EQ(depthwise, t.on_vector_unit);
      EXPECT_EQ(depthwise, k.func.find("linalg.matmul") == std::string::npos);
      if (depthwise) {
        EXPECT_NE(k.func.find("arith.mulf"), std::string::npos);
      }
      // every tap of the window
      if (padded || c.groups > 1) {
        EXPECT_NE(k.func.find(fmt::format("tap ({}, {})", c.kh - 1, c.kw - 1)), std::string::npos);
      }
      if (c.groups > 1 && !depthwise) {
        EXPECT_NE(k.func.find("over [channel in group, oc]"), std::string::npos);
      }
      kinds[depthwise ? "depthwise" : c.groups > 1 ? "grouped" : c.dil_h > 1 ? "dilated" : padded ? "padded" : "plain"]++;
    }
  }
  EXPECT_GE(kinds["grouped"], 1);
  EXPECT_GE(kinds["dilated"], 1);
  EXPECT_GE(kinds["depthwise"], 1);
  EXPECT_GE(kinds["padded"], 1);
  if (testenv::have_shared()) {
    EXPECT_EQ(kinds["depthwise"], 1 + 17);  // conv_kinds' and mobilenet_v2's
    EXPECT_GE(kinds["plain"], 34);          // mobilenet_v2's pointwise ones
  }
}

// The check mode with f32 storage (docs/ktir.md, "What is compared"): the same functions with every f16
// type f32, and tessel's functional simulation of that program meets mobilenet_v2's reference outputs
// (around 1e-9: f16 storage flushes them) to f32 accuracy — the values ktir_cpu_chain compares with.
TEST(Ktir, F32CheckStorageKeepsTheSchedule) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  testenv::CorpusCase cc = testenv::load_corpus_model("mobilenet_v2");
  DataflowCompile dc = compile_spyre("mobilenet_v2");
  const tile::TileProgram wide = ktir::ktir_widened_storage(dc.program);
  EXPECT_EQ(wide.float_dtype, DType::f32);
  EXPECT_FALSE(wide.dl16);
  const ktir::KtirExport e16 = ktir::export_ktir_kernels(dc.program, dc.module);
  const ktir::KtirExport e32 = ktir::export_ktir_kernels(wide, dc.module);
  ASSERT_EQ(e16.kernels.size(), e32.kernels.size());
  // the memory side (views, access tiles, loads) line by line, f16 read as f32; only conversions differ
  auto memory_lines = [](std::string f, bool widen) {
    if (widen)
      for (size_t at = f.find("f16"); at != std::string::npos; at = f.find("f16", at + 3)) f.replace(at, 3, "f32");
    std::string r, line;
    std::istringstream in(f);
    while (std::getline(in, line))
      if (line.find("ktdp.") != std::string::npos || line.find("access_tile_set") != std::string::npos ||
          line.find("coordinate_set") != std::string::npos)
        r += (line.find("ktdp.store") != std::string::npos ? line.substr(line.find(",")) : line) + "\n";
    return r;
  };
  for (size_t i = 0; i < e16.kernels.size(); ++i) {
    SCOPED_TRACE(e16.kernels[i].tile_kernel);
    EXPECT_EQ(e16.kernels[i].tile_kernel, e32.kernels[i].tile_kernel);
    const std::string a = memory_lines(e16.kernels[i].func, true), b = memory_lines(e32.kernels[i].func, false);
    EXPECT_GT(a.size(), 100u);
    EXPECT_EQ(a, b);
  }
  const dataflow::FunctionalResult r16 = dataflow::run_functional(dc.program, dc.module, cc.inputs);
  const dataflow::FunctionalResult r32 = dataflow::run_functional(wide, dc.module, cc.inputs);
  ASSERT_EQ(r32.outputs.size(), cc.refs.size());
  auto rel = [&](const Tensor& got, const Tensor& want) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      d = std::max(d, std::abs(static_cast<double>(got.data<float>()[i]) - want.data<float>()[i]));
      s = std::max(s, std::abs(static_cast<double>(want.data<float>()[i])));
    }
    return d / s;
  };
  EXPECT_LT(rel(r32.outputs[0], cc.refs[0]), 1e-4);
  EXPECT_GT(rel(r16.outputs[0], cc.refs[0]), 0.1);  // f16 storage cannot hold them
  EXPECT_EQ(r32.flushed, 0);
}

// A matmul whose K the mapper splits over cores (examples/ksplit_linear: K = 1024 over 4 cores): each core's
// partial sum goes through ktdp.inter_tile_produce / inter_tile_reduce over its group — the cores g + j·G,
// G the other splits' product, as ktir-cpu numbers them — and the group's first core stores the sum.
TEST(Ktir, KSplitSumsAcrossTheGroup) {
  const std::string model = testenv::source_dir() + "/examples/ksplit_linear";
  ModelPaths mp = resolve_model(model);
  DataflowCompile dc = compile_dataflow(mp.model, {}, hw::load_preset("spyre"));
  const ktir::KtirExport e = ktir::export_ktir_kernels(dc.program, dc.module);
  EXPECT_TRUE(e.skipped.empty()) << fmt::format("{}", fmt::join(e.skipped, "; "));
  const tile::TileKernel* mm = last_matmul(dc.program);
  ASSERT_NE(mm, nullptr);
  int64_t ksplit = 1, others = 1;
  for (const tile::Dim& d : mm->dims) (d.name == "k" ? ksplit : others) *= d.split;
  ASSERT_GT(ksplit, 1) << "the mapper no longer splits K here: pick another shape";
  const ktir::KtirKernel* k = nullptr;
  for (const ktir::KtirKernel& x : e.kernels)
    if (x.tile_kernel == mm->name) k = &x;
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(check_ssa(k->func), "");
  EXPECT_TRUE(balanced(k->module));
  const std::string members = fmt::format("affine_set<(i)[g] : ((i - g) mod {0} == 0, i - g >= 0, -i + g + {1} >= 0)>", others,
                                          others * (ksplit - 1));
  EXPECT_NE(k->func.find("ktdp.inter_tile_produce producer_tiles_per_group = " + members), std::string::npos) << k->func;
  EXPECT_NE(k->func.find("consumer_tiles_per_group = " + members), std::string::npos);
  EXPECT_NE(k->func.find(fmt::format("groups = affine_set<(g) : (g >= 0, -g + {} >= 0)>", others - 1)), std::string::npos);
  EXPECT_NE(k->func.find("arith.cmpi eq, %tid_k, %c0 : index"), std::string::npos);  // the writer
}

// An uneven K split (examples/ksplit_uneven: K = 1100 over 6 cores of 192, the last core's 140 a partial
// tile): the whole tiles' loop bound follows the core (arith.select), the partial tile runs in a loop of one
// trip on the last core only, and every core of the group still reaches the cross-core sum.
TEST(Ktir, KSplitUnevenSlices) {
  const std::string model = testenv::source_dir() + "/examples/ksplit_uneven";
  ModelPaths mp = resolve_model(model);
  DataflowCompile dc = compile_dataflow(mp.model, {}, hw::load_preset("spyre"));
  const ktir::KtirExport e = ktir::export_ktir_kernels(dc.program, dc.module);
  EXPECT_TRUE(e.skipped.empty()) << fmt::format("{}", fmt::join(e.skipped, "; "));
  const tile::TileKernel* mm = last_matmul(dc.program);
  ASSERT_NE(mm, nullptr);
  const tile::Dim* k = nullptr;
  for (const tile::Dim& d : mm->dims)
    if (d.name == "k") k = &d;
  ASSERT_NE(k, nullptr);
  ASSERT_GT(k->split, 1);
  const int64_t rest = k->size - (k->split - 1) * k->slice;
  ASSERT_TRUE(rest > 0 && rest < k->slice && rest % k->tile != 0) << "the mapper no longer splits K unevenly here: pick another shape";
  const ktir::KtirKernel* x = nullptr;
  for (const ktir::KtirKernel& y : e.kernels)
    if (y.tile_kernel == mm->name) x = &y;
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(check_ssa(x->func), "");
  EXPECT_TRUE(balanced(x->module));
  EXPECT_NE(x->func.find(fmt::format("arith.cmpi slt, %tid_k, %c{} : index", k->split - 1)), std::string::npos) << x->func;
  EXPECT_NE(x->func.find(fmt::format("arith.cmpi eq, %tid_k, %c{} : index", k->split - 1)), std::string::npos);
  EXPECT_NE(x->func.find(fmt::format("arith.select %on_k0, %c{}, %c0 : index", rest / k->tile * k->tile)), std::string::npos);
  EXPECT_NE(x->func.find(fmt::format("{}xf16>", rest % k->tile)), std::string::npos);  // the partial tile of A
  EXPECT_NE(x->func.find("ktdp.inter_tile_reduce"), std::string::npos);
}

// examples/vit_tiny: everything but the host steps is exported — the 8x8 patch embedding as a sum over its
// 64 taps (one a leading stride-1 dim away from a stick); its per-head scale reads rows of 17 tokens in
// tiles of 2, so a tile crosses a head and goes row by row.
TEST(Ktir, VitTilesAcrossAHeadGoRowByRow) {
  const std::string model = testenv::source_dir() + "/examples/vit_tiny";
  ModelPaths mp = resolve_model(model);
  DataflowCompile dc = compile_dataflow(mp.model, {}, hw::load_preset("spyre"));
  std::vector<std::string> skipped;
  const std::string text = ktir::export_ktir(dc.program, dc.module, &skipped);
  for (const std::string& s : skipped) EXPECT_NE(s.find(": host step"), std::string::npos) << s;
  EXPECT_NE(text.find("tap (7, 7)"), std::string::npos);  // the last of the patch embedding's taps
  for (const auto& [name, f] : functions(text)) EXPECT_EQ(check_ssa(f), "") << name;
  for (const std::string& op : op_names(text)) EXPECT_TRUE(known_ops().count(op)) << "unknown op " << op;
  EXPECT_NE(text.find("tensor.insert_slice"), std::string::npos);  // the loads (its stores are affine)
}
