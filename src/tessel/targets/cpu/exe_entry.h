// The files of one executable-cache entry (docs/runtime/compiled-backend.md, "The executable
// cache"): the kernel module's text, its constants and oneDNN's packed weights as raw bytes, and a
// manifest that ties them to a shared object. Every file's size and XXH3-128 checksum is in the
// manifest, which carries its own checksum and the entry's key; reading verifies all of them before
// anything is used. Reading maps the binary files instead of copying them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/support/checksum.h"

namespace tessel {

// A read-only view of a whole file, kept alive by `owner`.
struct FileBytes {
  std::shared_ptr<void> owner;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// mmap (MAP_PRIVATE: writes through the view never reach the file) of a regular file. Throws naming
// the file.
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
  std::string key;                                // the entry's key (its folder's name in the cache)
  std::string model;                              // for people reading the cache
  std::string so_path;                            // the generated kernels (empty: none)
  Checksum so;                                    // of so_path's bytes
  Checksum module, constants, packed;             // of module.tkl, constants.bin, packed.bin
  int threads = 0;
  std::vector<EntryBlob> blobs;                   // blob<N> of module.tkl
  std::vector<EntryPacked> packed_weights;
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
// manifest.json (last) into `dir`, which must exist. `m.blobs`, `m.packed_weights` and the files'
// checksums are filled in; `m.key`, `m.so_path` and `m.so` come from the caller.
void write_entry(const std::string& dir, const std::string& module_text, const std::vector<BlobToStore>& blobs,
                 const std::vector<PackedToStore>& packed, EntryManifest m);

struct EntryReadOptions {
  std::string key;               // non-empty: the manifest must name this key
  bool verify_checksums = true;  // false only to fuzz the parsers behind the checksums
};

struct LoadedEntry {
  EntryManifest manifest;
  std::string module_text;
  std::string module_path;
  FileBytes constants, packed;
};

// The manifest of the entry in `dir` alone, checked against its own checksum (and `options.key`);
// no other file is read. What `tessel cache` shows of an entry, and how the cache's pruner finds the
// kernels an entry needs. Throws tessel::Error as read_entry does.
EntryManifest read_manifest(const std::string& dir, const EntryReadOptions& options = {});

// Reads an entry written by write_entry. Total over arbitrary bytes: returns, or throws tessel::Error
// naming the file and what was wrong (missing or not a regular file, too large, a manifest that is
// not JSON, of another format or another key, a checksum or size that differs, offsets outside or
// misaligned in the files); never crashes. The shared object is only named here (load_cpu checks it).
LoadedEntry read_entry(const std::string& dir, const EntryReadOptions& options = {});

}  // namespace tessel
