// libFuzzer harness: ONNX model bytes -> the importer -> the verifier -> the printer (what
// `tessel run model.onnx` does before any pass). Seeds: tests/fuzz/onnx/.
#include "fuzz_util.h"
#include "tessel/driver/compile_model.h"
#include "tessel/ir/printer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tessel::fuzz::write_scratch("model.onnx", tessel::fuzz::as_text(data, size));
  tessel::fuzz::refusing_is_fine([&] {
    tessel::ImportedModel m = tessel::import_model_file(path);  // imports and verifies
    (void)tessel::print_graph(*m.graph);
  });
  return 0;
}
