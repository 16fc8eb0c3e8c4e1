// libFuzzer harness: an executable-cache entry (exe_entry.h) -> read_entry -> the kernel module's text
// parser with the entry's blobs, as load_cpu does up to (not including) loading the shared object:
// a fuzzed so_path must never be dlopen'ed. The input is the entry's files in the order below,
// separated by kSeparator; missing trailing pieces are missing files. Seeds: tests/fuzz/exe_entry/.
#include <array>

#include "fuzz_util.h"
#include "tessel/kernel/kernel.h"
#include "tessel/runtime/exe_entry.h"

namespace {

constexpr std::string_view kSeparator = "\n--8<--\n";
constexpr std::array<const char*, 4> kFiles = {"manifest.json", "module.tkl", "constants.bin", "packed.bin"};

void write_entry_files(std::string_view input) {
  for (const char* name : kFiles) std::filesystem::remove(tessel::fuzz::scratch_dir() / name);
  for (const char* name : kFiles) {
    const size_t at = input.find(kSeparator);
    tessel::fuzz::write_scratch(name, input.substr(0, at));
    if (at == std::string_view::npos) return;
    input.remove_prefix(at + kSeparator.size());
  }
}

// load_cpu's blob source (compiled_backend.cpp): blob<i> is the manifest's i-th range of constants.bin.
tessel::BlobSource entry_blobs(const tessel::LoadedEntry& e) {
  return [&e](int i, const tessel::TensorType& t) -> tessel::Tensor {
    if (i < 0 || static_cast<size_t>(i) >= e.manifest.blobs.size()) return {};
    const tessel::EntryBlob& b = e.manifest.blobs[static_cast<size_t>(i)];
    if (b.nbytes != static_cast<uint64_t>(tessel::shape_numel(t.shape)) * tessel::dtype_size(t.dtype)) return {};
    return tessel::Tensor::adopt(t.dtype, t.shape, e.constants.owner, const_cast<uint8_t*>(e.constants.data + b.offset));
  };
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_entry_files(tessel::fuzz::as_text(data, size));
  tessel::fuzz::refusing_is_fine([&] {
    const tessel::LoadedEntry e = tessel::read_entry(tessel::fuzz::scratch_dir().string());
    (void)tessel::parse_kernel_module(e.module_text, e.module_path, entry_blobs(e));
  });
  return 0;
}
