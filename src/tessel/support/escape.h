// One escaping function per output language: model-controlled text (node, value, graph and model
// names, loc strings, op domains, attribute strings) never becomes code, markup or a line break.
// docs/security.md says which output uses which function and why.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>

namespace tessel {

// Error messages, logs and human reports (tables, summaries): printable ASCII and valid UTF-8 kept;
// `\` as `\\`; \n \r \t as `\n` `\r` `\t`; other control characters, invalid UTF-8 bytes as `\xNN`;
// C1 controls, bidi overrides, zero-width and line/paragraph separators as `\u{XXXX}`. One line,
// always; two different names never display alike.
std::string display_text(std::string_view s);

// Text inside a `//` comment of generated C++: printable ASCII only (everything else as `\xNN` or
// `\u{XXXX}`), no backslash at all (`\` is `\x5c`, so no line splice), no `*/` or `/*`, no `??`.
std::string cpp_comment_text(std::string_view s);
// A complete C++ string literal "..." holding exactly the bytes of s: printable ASCII but `"` `\` `?`
// as is, everything else as a three-digit octal escape (never greedy like \x).
std::string cpp_string_literal(std::string_view s);

// Text and attribute values of HTML (`tessel report`): display_text, then `&` `<` `>` `"` `'` as
// entities, so a name is never markup, never ends an attribute, and displays on one line.
std::string html_text(std::string_view s);

// Text inside a `//` comment of MLIR / KTIR: display_text (MLIR comments end at \n or \r).
std::string mlir_comment_text(std::string_view s);
// A complete MLIR string literal "..." holding exactly the bytes of s: `\"` `\\` `\n` `\t`, every
// other byte outside printable ASCII as `\XX` (MLIR's two-hex-digit escape).
std::string mlir_string_literal(std::string_view s);

// JSON text of j; invalid UTF-8 inside strings becomes U+FFFD instead of throwing (nlohmann escapes
// quotes, backslashes and control characters itself). Every JSON tessel writes goes through this.
std::string json_dump(const nlohmann::json& j, int indent = -1);
// A complete JSON string literal "..." of s, for the few JSON texts written by hand (traces).
std::string json_string_literal(std::string_view s);

// [A-Za-z_][A-Za-z0-9_]*: the only names allowed where text must be an identifier.
bool is_plain_identifier(std::string_view s);

}  // namespace tessel
