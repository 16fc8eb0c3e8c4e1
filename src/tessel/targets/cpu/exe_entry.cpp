// Executable-cache entry files (see exe_entry.h).
#include "tessel/targets/cpu/exe_entry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"

namespace tessel {

// 2: every file's checksum, the key and the manifest's own checksum (issue 12).
const char* const kEntryFormat = "tessel-executable-2";

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Real manifests are a few KB (one line per packed weight); the bound keeps a hostile one's parse
// (nlohmann builds the whole tree) far below a GB.
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxModuleBytes = uint64_t{1} << 28;
constexpr uint64_t kBlobAlign = 64, kPackedAlign = 4096;

[[noreturn]] void entry_error(const std::string& file, const std::string& msg) {
  throw Error(Location{.file = file, .pass = "executable cache"}, msg);
}

// An ofstream that also checksums what goes through it.
struct HashedFile {
  std::ofstream f;
  ChecksumBuilder sum;
  void write(const void* p, uint64_t n) {
    f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    sum.update(p, n);
  }
};

Checksum write_file(const fs::path& path, const std::string& what, auto&& writer) {
  HashedFile h{std::ofstream(path, std::ios::binary | std::ios::trunc), {}};
  if (!h.f) entry_error(path.string(), fmt::format("cannot create the {}: {}", what, std::strerror(errno)));
  writer(h);
  h.f.close();
  if (!h.f) entry_error(path.string(), fmt::format("cannot write the {} (disk full?)", what));
  return h.sum.finish();
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Writes the pieces at offsets aligned to `align`, returning each offset.
std::vector<uint64_t> write_aligned(HashedFile& f, const std::vector<std::pair<const void*, uint64_t>>& pieces,
                                    uint64_t align) {
  std::vector<uint64_t> at;
  uint64_t pos = 0;
  static const char zeros[4096] = {};
  for (const auto& [p, n] : pieces) {
    const uint64_t start = align_up(pos, align);
    for (uint64_t pad = start - pos; pad > 0;) {
      const uint64_t c = std::min<uint64_t>(pad, sizeof zeros);
      f.write(zeros, c);
      pad -= c;
    }
    f.write(p, n);
    at.push_back(start);
    pos = start + n;
  }
  return at;
}

// Numbers of the manifest, by their JSON type: nlohmann's get<> would convert a float or a negative
// number (undefined behaviour when out of range).
uint64_t u64(const json& j) {
  if (!j.is_number_unsigned()) throw std::invalid_argument("a non-negative integer");
  return j.get<uint64_t>();
}

int small_int(const json& j) {
  if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() > (1 << 20)) throw std::invalid_argument("a thread count");
  return static_cast<int>(j.get<int64_t>());
}

json checksum_json(const Checksum& c) { return {{"size", c.size}, {"xxh3", c.xxh3}}; }

Checksum checksum_of(const json& j) {
  Checksum c{u64(j.at("size")), j.at("xxh3").get<std::string>()};
  if (c.xxh3.size() != 32 && !(c.xxh3.empty() && c.size == 0)) throw std::invalid_argument("a checksum of 32 hex digits");
  return c;
}

// The manifest's own checksum: over its canonical JSON text without the "checksum" member
// (nlohmann keeps members sorted and prints integers exactly, so a re-read prints the same text).
std::string manifest_checksum(const json& without) {
  const std::string text = json_dump(without);
  return checksum_bytes(text.data(), text.size()).xxh3;
}

json manifest_json(const EntryManifest& m) {
  json j;
  j["format"] = kEntryFormat;
  j["key"] = m.key;
  j["model"] = m.model;
  j["so_path"] = m.so_path;
  j["so"] = checksum_json(m.so);
  j["files"] = {{"module.tkl", checksum_json(m.module)},
                {"constants.bin", checksum_json(m.constants)},
                {"packed.bin", checksum_json(m.packed)}};
  j["threads"] = m.threads;
  j["blobs"] = json::array();
  for (const EntryBlob& b : m.blobs) j["blobs"].push_back({b.offset, b.nbytes});
  j["packed"] = json::array();
  for (const EntryPacked& p : m.packed_weights)
    j["packed"].push_back({{"kernel", p.kernel}, {"offset", p.offset}, {"nbytes", p.nbytes}, {"layout", p.layout}});
  j["checksum"] = manifest_checksum(j);
  return j;
}

EntryManifest parse_manifest(const std::string& path, const std::string& text, const EntryReadOptions& o) {
  EntryManifest m;
  try {
    json j = json::parse(text);
    if (!j.is_object()) entry_error(path, "damaged manifest: not a JSON object");
    m.format = j.at("format").get<std::string>();
    if (m.format != kEntryFormat) entry_error(path, fmt::format("format '{}' is not this build's '{}'", m.format, kEntryFormat));
    const std::string sum = j.at("checksum").get<std::string>();
    j.erase("checksum");
    if (o.verify_checksums && sum != manifest_checksum(j)) entry_error(path, "damaged manifest: its checksum does not match");
    m.key = j.at("key").get<std::string>();
    if (!o.key.empty() && m.key != o.key)
      entry_error(path, fmt::format("the manifest of entry '{}' is not this entry's ('{}')", m.key, o.key));
    m.model = j.at("model").get<std::string>();
    m.so_path = j.at("so_path").get<std::string>();
    m.so = checksum_of(j.at("so"));
    const json& files = j.at("files");
    m.module = checksum_of(files.at("module.tkl"));
    m.constants = checksum_of(files.at("constants.bin"));
    m.packed = checksum_of(files.at("packed.bin"));
    m.threads = small_int(j.at("threads"));
    for (const auto& b : j.at("blobs")) m.blobs.push_back({u64(b.at(0)), u64(b.at(1))});
    for (const auto& p : j.at("packed"))
      m.packed_weights.push_back({u64(p.at("kernel")), u64(p.at("offset")), u64(p.at("nbytes")), p.at("layout").get<std::string>()});
  } catch (const json::exception& x) {
    entry_error(path, fmt::format("damaged manifest: {}", x.what()));
  } catch (const std::invalid_argument& x) {
    entry_error(path, fmt::format("damaged manifest: expected {}", x.what()));
  }
  return m;
}

void check_size(const std::string& path, uint64_t n, const Checksum& want) {
  if (n != want.size) entry_error(path, fmt::format("{} bytes, the manifest says {}", n, want.size));
}

void check_checksum(const std::string& path, const Checksum& got, const Checksum& want) {
  if (const std::string why = checksum_mismatch(got, want); !why.empty()) entry_error(path, why);
}

// The checksums of two mapped files, the second on its own thread when both are large: tblock_bert's
// 28 + 28 MB take 1.6 ms each here (first touch of the mapping included), so the warm start pays
// for one of them.
std::pair<Checksum, Checksum> checksums_of_two(const FileBytes& a, const FileBytes& b) {
  constexpr size_t kWorthAThread = size_t{4} << 20;
  std::pair<Checksum, Checksum> r;
  if (a.size >= kWorthAThread && b.size >= kWorthAThread) {
    std::thread t;
    try {
      t = std::thread([&] { r.second = checksum_bytes(b.data, b.size); });
    } catch (const std::system_error&) {
      return {checksum_bytes(a.data, a.size), checksum_bytes(b.data, b.size)};  // no thread to be had
    }
    try {
      r.first = checksum_bytes(a.data, a.size);
    } catch (...) {
      t.join();
      throw;
    }
    t.join();
    return r;
  }
  return {checksum_bytes(a.data, a.size), checksum_bytes(b.data, b.size)};
}

// [offset, offset + nbytes) inside a file of `size` bytes and aligned, without overflow.
void check_range(const std::string& path, const std::string& what, uint64_t offset, uint64_t nbytes, uint64_t size,
                 uint64_t align) {
  if (nbytes > size || offset > size - nbytes)
    entry_error(path, fmt::format("{} at {} of {} bytes is past the end ({} bytes)", what, offset, nbytes, size));
  if (offset % align != 0) entry_error(path, fmt::format("{} at {} is not {}-byte aligned", what, offset, align));
}

}  // namespace

FileBytes map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) entry_error(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    const int e = errno;
    ::close(fd);
    entry_error(path, fmt::format("cannot stat: {}", std::strerror(e)));
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    entry_error(path, fmt::format("is {}; expected a regular cache file", file_kind(sb.st_mode)));
  }
  FileBytes fb;
  fb.size = static_cast<size_t>(sb.st_size);
  if (fb.size == 0) {
    ::close(fd);
    return fb;
  }
  void* p = ::mmap(nullptr, fb.size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) entry_error(path, fmt::format("cannot map: {}", std::strerror(e)));
  const size_t n = fb.size;
  fb.owner = std::shared_ptr<void>(p, [n](void* q) { ::munmap(q, n); });
  fb.data = static_cast<const uint8_t*>(p);
  return fb;
}

void write_entry(const std::string& dir, const std::string& module_text, const std::vector<BlobToStore>& blobs,
                 const std::vector<PackedToStore>& packed, EntryManifest m) {
  const fs::path d(dir);
  m.module = write_file(d / "module.tkl", "kernel module text", [&](HashedFile& f) { f.write(module_text.data(), module_text.size()); });
  std::vector<std::pair<const void*, uint64_t>> pieces;
  for (const BlobToStore& b : blobs) pieces.emplace_back(b.data, b.nbytes);
  m.constants = write_file(d / "constants.bin", "constants file", [&](HashedFile& f) {
    const std::vector<uint64_t> at = write_aligned(f, pieces, kBlobAlign);
    m.blobs.clear();
    for (size_t i = 0; i < blobs.size(); ++i) m.blobs.push_back({at[i], blobs[i].nbytes});
  });
  // Kernels sharing one packing (the same weights, compiled_backend.cpp) store it once.
  pieces.clear();
  std::map<std::pair<const void*, uint64_t>, size_t> piece_of;
  std::vector<size_t> piece(packed.size());
  for (size_t i = 0; i < packed.size(); ++i) {
    auto [it, fresh] = piece_of.try_emplace({packed[i].data, packed[i].nbytes}, pieces.size());
    if (fresh) pieces.emplace_back(packed[i].data, packed[i].nbytes);
    piece[i] = it->second;
  }
  m.packed = write_file(d / "packed.bin", "packed weights file", [&](HashedFile& f) {
    const std::vector<uint64_t> at = write_aligned(f, pieces, kPackedAlign);
    m.packed_weights.clear();
    for (size_t i = 0; i < packed.size(); ++i)
      m.packed_weights.push_back({packed[i].kernel, at[piece[i]], packed[i].nbytes, packed[i].layout});
  });
  const std::string text = json_dump(manifest_json(m), 1) + "\n";
  write_file(d / "manifest.json", "manifest", [&](HashedFile& f) { f.write(text.data(), text.size()); });
}

EntryManifest read_manifest(const std::string& dir, const EntryReadOptions& o) {
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  std::string mtext;
  try {
    mtext = read_regular_file(mpath, "cache manifest", kMaxManifestBytes);
  } catch (const Error& x) {
    entry_error(mpath, x.reason());
  }
  return parse_manifest(mpath, mtext, o);
}

LoadedEntry read_entry(const std::string& dir, const EntryReadOptions& o) {
  const fs::path d(dir);
  LoadedEntry e;
  e.manifest = read_manifest(dir, o);
  const EntryManifest& m = e.manifest;
  e.module_path = (d / "module.tkl").string();
  try {
    e.module_text = read_regular_file(e.module_path, "cached module text", kMaxModuleBytes);
  } catch (const Error& x) {
    entry_error(e.module_path, x.reason());
  }
  check_size(e.module_path, e.module_text.size(), m.module);
  if (o.verify_checksums) check_checksum(e.module_path, checksum_bytes(e.module_text.data(), e.module_text.size()), m.module);
  // Mapped, not read: measured on tblock_bert (28 MB packed), reading into huge pages made the load
  // 9 ms slower and MAP_POPULATE 12 ms slower, and neither made the first or later calls faster.
  // Hashing the mapping reads every page once (read faults map 16 pages each).
  const std::string cpath = (d / "constants.bin").string(), ppath = (d / "packed.bin").string();
  e.constants = map_file(cpath);
  e.packed = map_file(ppath);
  check_size(cpath, e.constants.size, m.constants);
  check_size(ppath, e.packed.size, m.packed);
  if (o.verify_checksums) {
    const auto [c, p] = checksums_of_two(e.constants, e.packed);
    check_checksum(cpath, c, m.constants);
    check_checksum(ppath, p, m.packed);
  }
  for (const EntryBlob& b : m.blobs) check_range(cpath, "a blob", b.offset, b.nbytes, e.constants.size, kBlobAlign);
  for (const EntryPacked& p : m.packed_weights)
    check_range(ppath, fmt::format("the packed weights of kernel {}", p.kernel), p.offset, p.nbytes, e.packed.size, kPackedAlign);
  return e;
}

}  // namespace tessel
