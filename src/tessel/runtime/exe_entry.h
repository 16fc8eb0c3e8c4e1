// The files of one executable-cache entry (docs/runtime/compiled-backend.md, "The executable
// cache"): the kernel module's text, its constants and oneDNN's packed weights as raw bytes, and a
// manifest that ties them to a shared object. Reading maps the binary files instead of copying them:
// constants nobody reads (weights that only fed a packing) are never touched.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessel {

// A read-only view of a whole file, kept alive by `owner`.
struct FileBytes {
  std::shared_ptr<void> owner;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// mmap (MAP_PRIVATE: writes through the view never reach the file). Throws naming the file.
FileBytes map_file(const std::string& path);

struct EntryBlob {
  uint64_t offset = 0, nbytes = 0;                // in constants.bin
};

struct EntryPacked {
  uint64_t kernel = 0;                            // index into the module's kernels
  uint64_t offset = 0, nbytes = 0;                // in packed.bin
  std::string layout;                             // cpu::PackedWeights::layout
};

struct EntryManifest {
  std::string format;                             // kEntryFormat when written by this build
  std::string model;                              // for people reading the cache
  std::string so_path;                            // the generated kernels (empty: none)
  int threads = 0;
  std::vector<EntryBlob> blobs;                   // blob<N> of module.tkl
  std::vector<EntryPacked> packed;
};

extern const char* const kEntryFormat;

// One packed weight to store: bytes owned by the caller for the duration of write_entry.
struct PackedToStore {
  uint64_t kernel = 0;
  const void* data = nullptr;
  uint64_t nbytes = 0;
  std::string layout;
};

struct BlobToStore {
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// Writes module.tkl, constants.bin (each blob 64-byte aligned), packed.bin (each 4 KiB aligned) and
// manifest.json (last) into `dir`, which must exist. `m.blobs` and `m.packed` are filled in.
void write_entry(const std::string& dir, const std::string& module_text, const std::vector<BlobToStore>& blobs,
                 const std::vector<PackedToStore>& packed, EntryManifest m);

struct LoadedEntry {
  EntryManifest manifest;
  std::string module_text;
  std::string module_path;
  FileBytes constants, packed;
};

// Reads an entry written by write_entry; throws naming the file on a missing file, a manifest of
// another format, or offsets outside the files.
LoadedEntry read_entry(const std::string& dir);

}  // namespace tessel
