// The escaping functions (support/escape.h) against their readers: the C++ compiler reads back every
// comment and string literal, nlohmann reads back JSON, and the display form stays one line.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "test_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

// Every payload class a hostile name may carry.
std::vector<std::string> payloads() {
  return {"plain",
          "new\nline",
          "cr\rlf",
          "ends with backslash\\",
          "backslash\\\nnewline",
          "backslash \\ \n spaced",
          "close */ open /* comment",
          "trigraph ?\?/\n?\?= ?\?'",
          "\n#include <stdlib.h>\n#error boom\n",
          "quotes \" ' `",
          std::string("nul\0byte", 8),
          "tab\tand\x01\x1f\x7f",
          "invalid utf8 \xff\xfe \xc0\x80 \xed\xa0\x80 \xe2\x82",
          "valid utf8 \xc3\xa9 \xe2\x82\xac",
          "bidi \xe2\x80\xae override \xe2\x80\xa8 line sep \xc2\x85 nel",
          "\n#include <stdlib.h>\n__attribute__((constructor)) static void p(){system(\"touch MARKER\");}"};
}

bool one_clean_line(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;
  return true;
}

int run_shell(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST(Escape, DisplayTextIsOneLineAndDistinguishesNames) {
  std::set<std::string> seen;
  for (const std::string& p : payloads()) {
    const std::string d = display_text(p);
    EXPECT_TRUE(one_clean_line(d)) << d;
    EXPECT_TRUE(seen.insert(d).second) << "two payloads display alike: " << d;
  }
  EXPECT_EQ(display_text("a\nb"), "a\\nb");
  EXPECT_EQ(display_text(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(display_text("a\\n"), "a\\\\n");  // a backslash and an n, not a newline
  EXPECT_EQ(display_text("\xff"), "\\xff");
  EXPECT_EQ(display_text("\xe2\x80\xae"), "\\u{202e}");
  EXPECT_EQ(display_text("caf\xc3\xa9"), "caf\xc3\xa9");  // valid UTF-8 stays readable
}

// HTML text and attribute values: no markup character survives, and decoding the five entities gives
// back exactly the display form.
TEST(Escape, HtmlTextIsNeverMarkupAndDecodesToTheDisplayForm) {
  std::vector<std::string> all = payloads();
  all.push_back("<script>alert(1)</script>");
  all.push_back("\"><img src=x onerror=alert(1)>");
  all.push_back("' onmouseover='x");
  all.push_back("&lt;already escaped&gt; &amp;");
  for (const std::string& p : all) {
    const std::string h = html_text(p);
    EXPECT_TRUE(one_clean_line(h)) << h;
    for (char c : {'<', '>', '"', '\''}) EXPECT_EQ(h.find(c), std::string::npos) << h;
    std::string back;
    for (size_t i = 0; i < h.size();) {
      bool entity = false;
      for (const auto& [e, c] : std::vector<std::pair<std::string, char>>{
               {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&#39;", '\''}}) {
        if (h.compare(i, e.size(), e) == 0) {
          back += c;
          i += e.size();
          entity = true;
          break;
        }
      }
      if (!entity) {
        ASSERT_NE(h[i], '&') << "a bare & in " << h;
        back += h[i++];
      }
    }
    EXPECT_EQ(back, display_text(p));
  }
}

TEST(Escape, ErrorsRenderOnOneLine) {
  for (const std::string& p : payloads()) {
    Error e(Location{.file = p, .node = p, .op = p, .pass = p, .line = 1, .column = 2}, "reason " + p);
    EXPECT_TRUE(one_clean_line(e.what())) << e.what();
    EXPECT_EQ(e.reason(), "reason " + p);  // the raw text stays available to callers
    Error outer = Error(Location{}, p).with_context(Location{.node = p});
    EXPECT_TRUE(one_clean_line(outer.what())) << outer.what();
  }
}

TEST(Escape, JsonRoundTripsOrReplacesInvalidUtf8) {
  for (const std::string& p : payloads()) {
    const std::string text = json_string_literal(p);
    for (unsigned char c : text) EXPECT_GE(c, 0x20) << text;  // JSON allows a raw DEL (0x7f)
    const nlohmann::json back = nlohmann::json::parse(text);  // valid JSON whatever the bytes
    if (p.find("invalid") == std::string::npos) {
      EXPECT_EQ(back.get<std::string>(), p);
    }
    EXPECT_NO_THROW(json_dump(nlohmann::json{{"name", p}}, 1));
  }
}

TEST(Escape, MlirStringLiteralEscapesEveryByte) {
  for (const std::string& p : payloads()) {
    const std::string lit = mlir_string_literal(p);
    EXPECT_TRUE(one_clean_line(lit)) << lit;
    for (unsigned char c : lit) EXPECT_LT(c, 0x80) << lit;
    // The only quotes are the delimiters and escaped ones.
    for (size_t i = 1; i + 1 < lit.size(); ++i)
      if (lit[i] == '"') {
        EXPECT_EQ(lit[i - 1], '\\') << lit;
      }
    EXPECT_TRUE(one_clean_line(mlir_comment_text(p)));
  }
  EXPECT_EQ(mlir_string_literal("a\"b\\c\n\x01\xff"), "\"a\\\"b\\\\c\\n\\01\\FF\"");
}

TEST(Escape, PlainIdentifiers) {
  EXPECT_TRUE(is_plain_identifier("k0"));
  EXPECT_TRUE(is_plain_identifier("_a9"));
  for (const char* bad : {"", "0k", "a-b", "a b", "a\n", "k0;system", "\xc3\xa9"}) EXPECT_FALSE(is_plain_identifier(bad)) << bad;
}

// The oracle is g++ itself (with the flags the compiled backend uses: -Wall -Wextra -Werror): a
// file that puts every payload in a `//` comment and in a string literal must compile, define
// nothing else, and print each payload's exact bytes back.
TEST(Escape, CppCommentsAndStringLiteralsReadBackByTheCompiler) {
  const fs::path dir = fs::temp_directory_path() / ("tessel_escape_cpp_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::vector<std::string> ps = payloads();
  std::string src = "#include <cstdio>\n#include <cstring>\n";
  src += "static const char* const k[] = {\n";
  for (const std::string& p : ps) {
    const std::string c = cpp_comment_text(p);
    EXPECT_TRUE(one_clean_line(c)) << c;
    EXPECT_EQ(c.find('\\' + std::string("\n")), std::string::npos);
    EXPECT_EQ(c.find("*/"), std::string::npos) << c;
    EXPECT_EQ(c.find("??"), std::string::npos) << c;
    for (unsigned char ch : c) EXPECT_LT(ch, 0x80) << c;
    src += "  // " + c + "\n";
    src += "  " + cpp_string_literal(p) + ",  // " + c + "\n";
  }
  src += "};\nstatic const unsigned long n[] = {";
  for (const std::string& p : ps) src += std::to_string(p.size()) + "UL, ";
  src += "};\nint main() {\n  for (unsigned i = 0; i < sizeof k / sizeof *k; ++i) { std::fwrite(k[i], 1, n[i], stdout); "
         "std::fputc(0x1e, stdout); }\n  return sizeof k / sizeof *k == " + std::to_string(ps.size()) + " ? 0 : 1;\n}\n";
  std::ofstream(dir / "payloads.cpp") << src;
  const std::string exe = (dir / "payloads").string();
  ASSERT_EQ(run_shell("g++ -std=c++20 -trigraphs -Wall -Wextra -Werror -o " + exe + " " + (dir / "payloads.cpp").string() +
                      " > " + (dir / "log").string() + " 2>&1"),
            0)
      << testenv::read_text((dir / "log").string());
  ASSERT_EQ(run_shell(exe + " > " + (dir / "out").string()), 0);
  std::ifstream f(dir / "out", std::ios::binary);
  const std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string want;
  for (const std::string& p : ps) want += p + '\x1e';
  EXPECT_EQ(out, want);
  fs::remove_all(dir);
}
