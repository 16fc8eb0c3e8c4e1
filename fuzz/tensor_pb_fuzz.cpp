// libFuzzer harness: a serialized TensorProto (a model-zoo test_data_set_N/input_N.pb) -> read_tensor_pb.
// Seeds: tests/fuzz/tensor_pb/.
#include "fuzz_util.h"
#include "tessel/frontend/onnx/importer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tessel::fuzz::write_scratch("input_0.pb", tessel::fuzz::as_text(data, size));
  tessel::fuzz::refusing_is_fine([&] { (void)tessel::read_tensor_pb(path); });
  return 0;
}
