// Executable-cache entry files (see exe_entry.h).
#include "tessel/runtime/exe_entry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessel/support/error.h"
#include "tessel/support/escape.h"

namespace tessel {

const char* const kEntryFormat = "tessel-executable-1";

namespace {

namespace fs = std::filesystem;

[[noreturn]] void entry_error(const std::string& file, const std::string& msg) {
  throw Error(Location{.file = file, .pass = "executable cache"}, msg);
}

void write_file(const fs::path& path, const std::string& what, auto&& writer) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) entry_error(path.string(), fmt::format("cannot create the {}: {}", what, std::strerror(errno)));
  writer(f);
  f.close();
  if (!f) entry_error(path.string(), fmt::format("cannot write the {} (disk full?)", what));
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Writes the pieces at offsets aligned to `align`, returning each offset.
std::vector<uint64_t> write_aligned(std::ofstream& f, const std::vector<std::pair<const void*, uint64_t>>& pieces,
                                    uint64_t align) {
  std::vector<uint64_t> at;
  uint64_t pos = 0;
  static const char zeros[4096] = {};
  for (const auto& [p, n] : pieces) {
    const uint64_t start = align_up(pos, align);
    for (uint64_t pad = start - pos; pad > 0;) {
      const uint64_t c = std::min<uint64_t>(pad, sizeof zeros);
      f.write(zeros, static_cast<std::streamsize>(c));
      pad -= c;
    }
    f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    at.push_back(start);
    pos = start + n;
  }
  return at;
}

}  // namespace

FileBytes map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) entry_error(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    const int e = errno;
    ::close(fd);
    entry_error(path, fmt::format("cannot stat: {}", std::strerror(e)));
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
  write_file(d / "module.tkl", "kernel module text", [&](std::ofstream& f) { f << module_text; });
  std::vector<std::pair<const void*, uint64_t>> pieces;
  for (const BlobToStore& b : blobs) pieces.emplace_back(b.data, b.nbytes);
  write_file(d / "constants.bin", "constants file", [&](std::ofstream& f) {
    const std::vector<uint64_t> at = write_aligned(f, pieces, 64);
    m.blobs.clear();
    for (size_t i = 0; i < blobs.size(); ++i) m.blobs.push_back({at[i], blobs[i].nbytes});
  });
  pieces.clear();
  for (const PackedToStore& p : packed) pieces.emplace_back(p.data, p.nbytes);
  write_file(d / "packed.bin", "packed weights file", [&](std::ofstream& f) {
    const std::vector<uint64_t> at = write_aligned(f, pieces, 4096);
    m.packed.clear();
    for (size_t i = 0; i < packed.size(); ++i) m.packed.push_back({packed[i].kernel, at[i], packed[i].nbytes, packed[i].layout});
  });
  nlohmann::json j;
  j["format"] = kEntryFormat;
  j["model"] = m.model;
  j["so_path"] = m.so_path;
  j["threads"] = m.threads;
  j["blobs"] = nlohmann::json::array();
  for (const EntryBlob& b : m.blobs) j["blobs"].push_back({b.offset, b.nbytes});
  j["packed"] = nlohmann::json::array();
  for (const EntryPacked& p : m.packed)
    j["packed"].push_back({{"kernel", p.kernel}, {"offset", p.offset}, {"nbytes", p.nbytes}, {"layout", p.layout}});
  write_file(d / "manifest.json", "manifest", [&](std::ofstream& f) { f << json_dump(j, 1) << "\n"; });
}

LoadedEntry read_entry(const std::string& dir) {
  const fs::path d(dir);
  LoadedEntry e;
  const std::string mpath = (d / "manifest.json").string();
  std::ifstream mf(mpath);
  if (!mf) entry_error(mpath, "no manifest");
  try {
    const nlohmann::json j = nlohmann::json::parse(mf);
    e.manifest.format = j.at("format").get<std::string>();
    if (e.manifest.format != kEntryFormat)
      entry_error(mpath, fmt::format("format '{}' is not this build's '{}'", e.manifest.format, kEntryFormat));
    e.manifest.model = j.at("model").get<std::string>();
    e.manifest.so_path = j.at("so_path").get<std::string>();
    e.manifest.threads = j.at("threads").get<int>();
    for (const auto& b : j.at("blobs")) e.manifest.blobs.push_back({b.at(0).get<uint64_t>(), b.at(1).get<uint64_t>()});
    for (const auto& p : j.at("packed"))
      e.manifest.packed.push_back({p.at("kernel").get<uint64_t>(), p.at("offset").get<uint64_t>(),
                                   p.at("nbytes").get<uint64_t>(), p.at("layout").get<std::string>()});
  } catch (const nlohmann::json::exception& x) {
    entry_error(mpath, fmt::format("damaged manifest: {}", x.what()));
  }
  e.module_path = (d / "module.tkl").string();
  std::ifstream tf(e.module_path, std::ios::binary);
  if (!tf) entry_error(e.module_path, "missing");
  std::ostringstream ss;
  ss << tf.rdbuf();
  e.module_text = ss.str();
  e.constants = map_file((d / "constants.bin").string());
  // Mapped, not read: measured on tblock_bert (28 MB packed), reading into huge pages made the load
  // 9 ms slower and MAP_POPULATE 12 ms slower, and neither made the first or later calls faster.
  e.packed = map_file((d / "packed.bin").string());
  for (const EntryBlob& b : e.manifest.blobs)
    if (b.offset + b.nbytes > e.constants.size)
      entry_error((d / "constants.bin").string(), fmt::format("a blob at {} of {} bytes is past the end ({} bytes)", b.offset,
                                                              b.nbytes, e.constants.size));
  for (const EntryPacked& p : e.manifest.packed)
    if (p.offset + p.nbytes > e.packed.size)
      entry_error((d / "packed.bin").string(), fmt::format("packed weights of kernel {} are past the end", p.kernel));
  return e;
}

}  // namespace tessel
