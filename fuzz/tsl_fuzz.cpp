// libFuzzer harness: .tsl text -> parse -> verify -> print -> parse -> print. A graph that parses and
// verifies must print to text that parses back and prints identically (printer.h's promise); a
// difference is reported as a crash. Seeds: tests/fuzz/tsl/ (the golden tests' .tsl files).
#include <cstdio>

#include "fuzz_util.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(tessel::fuzz::as_text(data, size));
  std::string printed;
  bool valid = false;
  tessel::fuzz::refusing_is_fine([&] {
    std::unique_ptr<tessel::Graph> g = tessel::parse_graph(text, "fuzz.tsl");
    tessel::verify_graph(*g);
    printed = tessel::print_graph(*g);
    valid = true;
  });
  if (!valid) return 0;
  std::string again;
  try {
    again = tessel::print_graph(*tessel::parse_graph(printed, "printed.tsl"));
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "round trip: the printed text does not parse: %s\n--- printed:\n%s\n", e.what(), printed.c_str());
    __builtin_trap();
  }
  if (again != printed) {
    std::fprintf(stderr, "round trip: print(parse(print(g))) != print(g)\n--- first:\n%s\n--- second:\n%s\n", printed.c_str(),
                 again.c_str());
    __builtin_trap();
  }
  return 0;
}
