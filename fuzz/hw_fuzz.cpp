// libFuzzer harness: hardware-file JSON text -> parse_hw_json (hw_json.cpp) -> describe. Seeds:
// tests/fuzz/hw/ (the presets in hw/).
#include "fuzz_util.h"
#include "tessel/hw/hw.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(tessel::fuzz::as_text(data, size));
  tessel::fuzz::refusing_is_fine([&] {
    const tessel::hw::HwSpec hw = tessel::hw::parse_hw_json(text, "fuzz.json");
    (void)tessel::hw::describe(hw);
  });
  return 0;
}
