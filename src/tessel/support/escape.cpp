// Escaping of model-controlled text for each output language (see escape.h).
#include "tessel/support/escape.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace tessel {
namespace {

// The code point of the UTF-8 sequence at s[i] and its length; length 0 when the bytes there are not
// well-formed UTF-8 (stray continuation bytes, overlong forms, surrogates, beyond U+10FFFF, cut short).
struct CodePoint {
  char32_t cp = 0;
  size_t len = 0;
};

CodePoint decode_utf8(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return {c, 1};
  size_t len = 0;
  char32_t cp = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else return {};
  if (i + len > s.size()) return {};
  for (size_t k = 1; k < len; ++k) {
    const unsigned char t = b(i + k);
    if (t < (k == 1 ? lo : 0x80) || t > (k == 1 ? hi : 0xbf)) return {};
    cp = cp << 6 | (t & 0x3f);
  }
  return {cp, len};
}

// Code points that reorder, hide or break the surrounding text: C1 controls, the Arabic letter mark,
// zero-width characters, line/paragraph separators, bidi embeddings/overrides/isolates, the BOM.
bool invisible_or_reordering(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x061c || (cp >= 0x200b && cp <= 0x200f) ||
         (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x2069) || cp == 0xfeff;
}

std::string hex_byte(unsigned char c) { return fmt::format("\\x{:02x}", c); }

// The escaping shared by display and comment text. ascii_only: every non-ASCII code point escaped
// too (generated C++ stays plain ASCII, whatever the compiler's input charset).
std::string escape_line(std::string_view s, bool ascii_only, std::string_view backslash) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const CodePoint p = decode_utf8(s, i);
      if (p.len == 0) {
        out += hex_byte(c);
        ++i;
        continue;
      }
      if (ascii_only || invisible_or_reordering(p.cp)) out += fmt::format("\\u{{{:04x}}}", static_cast<uint32_t>(p.cp));
      else out.append(s.substr(i, p.len));
      i += p.len;
      continue;
    }
    ++i;
    switch (c) {
      case '\\': out += backslash; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += hex_byte(c);
        else out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

std::string display_text(std::string_view s) { return escape_line(s, false, "\\\\"); }

std::string html_text(std::string_view s) {
  const std::string t = display_text(s);
  std::string out;
  out.reserve(t.size());
  for (char c : t) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string cpp_comment_text(std::string_view s) {
  const std::string t = escape_line(s, true, "\\x5c");
  // Sequences that mean something inside a comment: `*/` and `/*` (block comments) and `??`
  // (trigraphs, when a compiler reads them). The second character of each becomes an escape.
  std::string out;
  out.reserve(t.size());
  for (char c : t) {
    const char prev = out.empty() ? '\0' : out.back();
    if (c == '/' && prev == '*') out += "\\x2f";
    else if (c == '*' && prev == '/') out += "\\x2a";
    else if (c == '?' && prev == '?') out += "\\x3f";
    else out += c;
  }
  return out;
}

std::string cpp_string_literal(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '?') out += ch;
    else out += fmt::format("\\{:03o}", c);
  }
  return out + "\"";
}

std::string mlir_comment_text(std::string_view s) { return display_text(s); }

std::string mlir_string_literal(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') out += '\\', out += ch;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c >= 0x20 && c < 0x7f) out += ch;
    else out += fmt::format("\\{:02X}", c);
  }
  return out + "\"";
}

std::string json_dump(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_string_literal(std::string_view s) { return json_dump(nlohmann::json(std::string(s))); }

bool is_plain_identifier(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && (i == 0 || c < '0' || c > '9')) return false;
  }
  return true;
}

}  // namespace tessel
