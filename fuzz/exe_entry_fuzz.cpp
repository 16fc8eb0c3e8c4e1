// libFuzzer harness: an executable-cache entry (exe_entry.h) -> check_cpu_entry, which runs what
// load_cpu runs over the entry's bytes (manifest, files, kernel module text with its blobs, packed
// weights) up to, not including, loading the shared object: a fuzzed so_path is never dlopen'ed.
// The input is the entry's files in the order below, separated by kSeparator; missing trailing
// pieces are missing files. Seeds: tests/fuzz/exe_entry/.
#include <array>

#include "fuzz_util.h"
#include "tessel/runtime/compiled_backend.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_entry_files(tessel::fuzz::as_text(data, size));
  tessel::fuzz::refusing_is_fine([&] {
    // Checksums off: with them on almost every mutation would stop at the first one.
    (void)tessel::check_cpu_entry(tessel::fuzz::scratch_dir().string(), /*verify_checksums=*/false);
  });
  return 0;
}
