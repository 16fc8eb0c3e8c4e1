// Malformed literals in the three text forms (.tsl graph level, kernel level, tile level) are located
// parse errors — file:line:col and a reason — never a library exception (`internal error: stoll`).
#include <gtest/gtest.h>

#include <regex>

#include "tessel/hw/hw.h"
#include "tessel/ir/printer.h"
#include "tessel/kernel/kernel.h"
#include "tessel/passes/pass.h"
#include "tessel/support/error.h"
#include "tessel/targets/dataflow/map.h"
#include "tessel/tile/tile.h"

using namespace tessel;

namespace {

// The error a parse gives: a tessel::Error (anything else fails the test) rendered as its line.
template <typename F>
std::string parse_error(F&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a tessel::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string tsl_error(const std::string& text) {
  return parse_error([&] { parse_graph(text, "bad.tsl"); });
}

std::string graph_with(const std::string& line) {
  return "graph @g(%x: f32[2]) {\n" + line + "\n  %y: f32[2] = Identity(%x) loc(\"n\")\n  return %y\n}\n";
}

void expect_located(const std::string& msg, const std::string& where, const std::string& reason) {
  EXPECT_NE(msg.find(where), std::string::npos) << msg;
  EXPECT_NE(msg.find(reason), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

const char kSmallGraph[] = R"(graph @g(%x: f32[4, 8]) {
  const %axes: i64[1] = [1]
  %e: f32[4, 8] = Exp(%x) loc("exp")
  %y: f32[4] = ReduceSum(%e, %axes) {keepdims = 0} loc("sum")
  return %y
}
)";

KernelModule small_module() {
  auto g = parse_graph(kSmallGraph);
  run_pipeline(*g, parse_pipeline("core"), PassOptions{});
  return fuse(std::move(g));
}

}  // namespace

TEST(ParserErrors, TslIntegersBeyondInt64) {
  expect_located(tsl_error("graph @g(%x: f32[2]) {\n  %y: f32[2] = Identity(%x) {foo = 99999999999999999999} loc(\"n\")\n"
                           "  return %y\n}\n"),
                 "bad.tsl:2:", "integer 99999999999999999999 is out of range for int64");
  expect_located(tsl_error("graph @g(%x: f32[2]) {\n  %y: f32[2] = Identity(%x) {foo = [1, -99999999999999999999]} "
                           "loc(\"n\")\n  return %y\n}\n"),
                 "bad.tsl:2:", "out of range for int64");
  expect_located(tsl_error(graph_with("  const %c: i64[2] = [1, 99999999999999999999]")), "bad.tsl:2:26",
                 "out of range for int64");
  expect_located(tsl_error(graph_with("  const %c: u64[1] = [-1]")), "bad.tsl:2:", "expected an unsigned integer");
  expect_located(tsl_error(graph_with("  const %c: u64[1] = [99999999999999999999]")), "bad.tsl:2:", "out of range for u64");
  expect_located(tsl_error("graph @g(%x: f32[99999999999999999999]) {\n  return %x\n}\n"), "bad.tsl:1:", "out of range");
  // The largest values still read.
  auto g = parse_graph(graph_with("  const %c: i64[2] = [9223372036854775807, -9223372036854775808]"));
  EXPECT_EQ(g->constants().front()->constant->get_i(1), INT64_MIN);
}

// issue 41: a literal outside its element type is an error, not a wrapped value (i8 300 read as 44, u8 -1
// as 255); the type's own bounds still read.
TEST(ParserErrors, TslLiteralsOutsideTheirType) {
  expect_located(tsl_error(graph_with("  const %c: i8[2] = [300, 1]")), "bad.tsl:2:", "integer 300 is out of range for i8 ([-128, 127])");
  expect_located(tsl_error(graph_with("  const %c: u8[1] = [-1]")), "bad.tsl:2:", "integer -1 is out of range for u8 ([0, 255])");
  expect_located(tsl_error(graph_with("  const %c: i32[1] = [2147483648]")), "bad.tsl:2:", "out of range for i32");
  expect_located(tsl_error(graph_with("  const %c: u4[1] = [16]")), "bad.tsl:2:", "out of range for u4 ([0, 15])");
  auto g = parse_graph(graph_with("  const %c: i8[4] = [-128, 127, 0, -1]"));
  EXPECT_EQ(g->constants().front()->constant->get_i(0), -128);
  EXPECT_EQ(g->constants().front()->constant->get_i(1), 127);
  auto h = parse_graph(graph_with("  const %c: u16[2] = [65535, 0]"));
  EXPECT_EQ(h->constants().front()->constant->get_i(0), 65535);
}

// issue 41: a type of more than 64 dims is a parse error at the type (tessel's rank limit, kMaxRank).
TEST(ParserErrors, TslTypesOverTheRankLimit) {
  std::string dims65 = "1";
  for (int i = 1; i < 65; ++i) dims65 += ",1";
  expect_located(tsl_error("graph @g(%x: f32[" + dims65 + "]) {\n  return %x\n}\n"), "bad.tsl:1:", "more than 64 dims");
  std::string dims64 = "1";
  for (int i = 1; i < 64; ++i) dims64 += ",1";
  EXPECT_EQ(parse_graph("graph @g(%x: f32[" + dims64 + "]) {\n  return %x\n}\n")->inputs[0]->type.shape.size(), 64u);
}

TEST(ParserErrors, TslMalformedNumbers) {
  expect_located(tsl_error(graph_with("  const %c: f32[1] = [1.5.3]")), "bad.tsl:2:", "bad number '1.5.3'");
  expect_located(tsl_error(graph_with("  const %c: f32[1] = [.]")), "bad.tsl:2:", "bad number");
}

TEST(ParserErrors, TslBadEscapes) {
  for (const char* lit : {"\"n\\xZZ\"", "\"n\\x4\"", "\"n\\x\"", "\"n\\q\"", "\"n\\"}) {
    const std::string text = std::string("graph @g(%x: f32[2]) {\n  %y: f32[2] = Identity(%x) loc(") + lit + ")\n  return %y\n}\n";
    const std::string msg = tsl_error(text);
    EXPECT_NE(msg.find("bad.tsl:2:"), std::string::npos) << lit << ": " << msg;
    EXPECT_TRUE(msg.find("escape") != std::string::npos || msg.find("unterminated") != std::string::npos) << msg;
  }
  // \xHH itself reads, in either case.
  auto g = parse_graph("graph @g(%x: f32[2]) {\n  %y: f32[2] = Identity(%x) loc(\"a\\x0Ab\\x7f\")\n  return %y\n}\n");
  EXPECT_EQ(g->nodes().front()->name, "a\nb\x7f");
}

TEST(ParserErrors, StringsRoundTripEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  size_t pos = 0;
  const std::string q = quote_string(all);
  EXPECT_EQ(unquote_string(q, pos), all);
  EXPECT_EQ(pos, q.size());
}

// The kernel level text is also read from the executable cache: the same errors, and names with any
// byte survive it (its parser used to read quote_string's \xHH as the letter x).
TEST(ParserErrors, KernelModuleText) {
  KernelModule m = small_module();
  const std::string text = print_kernel_module(m);
  auto bad = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from, t.find("# kernels"));
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    return parse_error([&] { parse_kernel_module(t, "bad.tkl"); });
  };
  expect_located(bad("fused ", "fused 99999999999999999999 nodes, traffic 0 -> 0 bytes\n  x"), "bad.tkl:", "out of range for int64");
  expect_located(bad("kernel k0", "kernel 0k"), "bad.tkl:", "not an identifier");
  EXPECT_NE(bad("reduce.sum", "reduce.system").find("unknown reduction 'system'"), std::string::npos);
  // Instructions are checked against the core-op table: a name that is no instruction (parsed into the
  // kind and primitive enums), a primitive that is not elementwise, and a primitive with the wrong
  // operand count, are errors (not a crash in the code generator).
  expect_located(bad("= exp ", "= sub "), "bad.tkl:", "'sub' is no instruction");
  EXPECT_NE(bad("= exp ", "= reduce_window ").find("not an elementwise core primitive"), std::string::npos);
  EXPECT_NE(bad("= exp ", "= add ").find("takes 2 operands, not 1"), std::string::npos);
  expect_located(bad("from \"", "from \"\\xZ"), "bad.tkl:", "escape");
  const std::string msg = bad("from \"", "from \"\\q");
  EXPECT_TRUE(std::regex_search(msg, std::regex("bad\\.tkl:[0-9]+:[0-9]+: "))) << msg;

  // A source name with control characters and invalid UTF-8 comes back unchanged.
  m.kernels[0].sources[0] = std::string("a\nb\0c\xff\"\\", 8);
  KernelModule back = parse_kernel_module(print_kernel_module(m));
  EXPECT_EQ(back.kernels[0].sources[0], m.kernels[0].sources[0]);
}

TEST(ParserErrors, TileText) {
  KernelModule m = small_module();
  const tile::TileProgram p = dataflow::map_to_tiles(m, hw::load_preset("spyre"));
  const std::string text = tile::print_tile_program(p);
  auto bad = [&](const std::regex& from, const std::string& to) {
    const std::string t = std::regex_replace(text, from, to, std::regex_constants::format_first_only);
    EXPECT_NE(t, text);
    return parse_error([&] { tile::parse_tile_program(t, "bad.tile"); });
  };
  expect_located(bad(std::regex(" k0 "), " kZ "), "bad.tile:", "expected an integer");
  expect_located(bad(std::regex(" k0 "), " k99999999999999999999 "), "bad.tile:", "expected an integer");
  expect_located(bad(std::regex(" x[0-9]+ "), " x-1 "), "bad.tile:", "expected an int in [0,");
  expect_located(bad(std::regex("node \""), "node \"\\xZ"), "bad.tile:", "escape");
  expect_located(bad(std::regex("@t0 "), "@t0;x "), "bad.tile:", "not an identifier");
}
