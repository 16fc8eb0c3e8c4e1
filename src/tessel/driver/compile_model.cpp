// Model file -> compiled executable through the executable cache (see compile_model.h).
#include "tessel/driver/compile_model.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "tessel/driver/model_dir.h"
#include "tessel/support/checksum.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"
#include "tessel/support/progress.h"
#include "tessel/targets/cpu/cache_budget.h"
#include "tessel/support/threads.h"
#include "tessel/targets/cpu/dnnl_ops.h"
#include "tessel/targets/cpu/exe_entry.h"
#include "tessel/targets/cpu/toolchain.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The file holding this code (the tessel executable, or a library linking tessel_core) by size and
// modification time: a rebuilt tessel never loads entries an older build wrote.
std::string build_identity() {
  static const std::string id = [] {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&build_identity), &info) || !info.dli_fname) return std::string("unknown");
    // By inode, not by name: the same binary started through another path is the same build.
    struct stat sb {};
    if (::stat(info.dli_fname, &sb) != 0 && ::stat("/proc/self/exe", &sb) != 0) return std::string("unknown");
    return fmt::format("{} {} {} {}.{}", sb.st_dev, sb.st_ino, sb.st_size, sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
  }();
  return id;
}

// XXH3-128 of a file's bytes, read in chunks through one small buffer: mapping the file instead
// costs a page fault per few pages, which on a virtual machine is slower than the copy.
std::string file_hash(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(Location{.file = path}, fmt::format("cannot open: {}", std::strerror(errno)));
  ChecksumBuilder h;
  static thread_local std::vector<char> buf(size_t{1} << 20);
  ssize_t n = 0;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) h.update(buf.data(), static_cast<size_t>(n));
  const int e = errno;
  ::close(fd);
  if (n < 0) throw Error(Location{.file = path}, fmt::format("cannot read: {}", std::strerror(e)));
  return h.finish().xxh3;
}

// The content hash of a model file, remembered by the file's identity (device, inode, size, mtime,
// ctime) the way git's index and make do: a warm start then reads none of the model's bytes. A file
// modified less than a second before its hash was recorded is hashed again every time (git's "racy"
// rule: a later change within the same timestamp tick would go unseen).
std::string model_hash(const std::string& file, const fs::path& index_dir, bool trust_stat) {
  struct stat sb {};
  if (::stat(file.c_str(), &sb) != 0) throw Error(Location{.file = file}, fmt::format("cannot stat: {}", std::strerror(errno)));
  auto ns = [](const timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec; };
  const std::string identity = fmt::format("{} {} {} {} {}", sb.st_dev, sb.st_ino, sb.st_size, ns(sb.st_mtim), ns(sb.st_ctim));
  std::error_code ec;
  const fs::path abs = fs::absolute(file, ec);
  const fs::path idx = index_dir / (cpu::content_key({abs.string()}) + ".txt");
  // The last line checks the others: a damaged index is only a miss (the file is hashed again).
  auto seal = [](const std::string& id, const std::string& h, int64_t t) { return cpu::content_key({id, h, std::to_string(t)}); };
  if (trust_stat) {
    // A regular file of at most 1 KiB (a FIFO or a link to /dev/zero in its place is a miss, not a hang
    // or a 2 GB read: issue 41).
    std::istringstream f;
    try {
      f.str(read_regular_file(idx.string(), "model hash index", 1024));
    } catch (const Error&) {
      f.setstate(std::ios::failbit);
    }
    std::string line_identity, hash, check;
    int64_t recorded = 0;
    if (std::getline(f, line_identity) && std::getline(f, hash) && (f >> recorded >> check) && line_identity == identity &&
        ns(sb.st_mtim) + 1000000000 < recorded && hash.size() == 32 && check == seal(line_identity, hash, recorded))
      return hash;
  }
  const std::string hash = file_hash(file);
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  cpu::create_private_directories(index_dir.string(), ec);
  const std::string tmp = cpu::temporary_name(idx.string());
  {
    std::ofstream f(tmp);
    f << identity << "\n" << hash << "\n" << now << "\n" << seal(identity, hash, now) << "\n";
  }
  if (::rename(tmp.c_str(), idx.c_str()) != 0) fs::remove(tmp, ec);  // best effort: only a shortcut
  return hash;
}

std::string options_text(const CompiledBackendOptions& o, int threads) {
  // Not the model name: it only labels the generated file, and two names for one file share an entry.
  return fmt::format("threads={} pipeline={} fuse.matmul={} fuse.fuse={} cxx={} native={} opt={}", threads, o.pipeline,
                     o.fuse.matmul, o.fuse.fuse, o.toolchain.cxx, o.toolchain.native, o.toolchain.opt);
}

std::string inputs_text(const std::vector<Tensor>& ins) {
  std::string s;
  for (const Tensor& t : ins) s += TensorType{t.dtype(), t.shape()}.str() + ";";
  return s;
}

// The folder of an entry's kernels (a kernel cache entry), or empty when it has none.
std::string kernels_dir(const CompiledExecutable& exe) {
  const std::string& so = exe.stats().so_path;
  return so.empty() ? std::string() : fs::path(so).parent_path().string();
}

// Marks an entry used, then the kernels it uses: list_cache relies on kernels never being less
// recently used than the entries that need them (an entry without its kernels is a damaged one).
void mark_entry_used(const fs::path& entry, const CompiledExecutable& exe) {
  cpu::mark_used(entry.string());
  if (const std::string k = kernels_dir(exe); !k.empty()) cpu::mark_used(k);
}

// Why the entry of `exe` is not stored for the cache's budget, or empty. Its kernels count with it:
// the entry is useless without them.
std::string over_budget(const CompiledExecutable& exe, const cpu::ToolchainOptions& t, const fs::path& entry) {
  // The budget without the cache's own size first: it can only be smaller, and it saves listing a
  // large cache on every store when the entry fits anyway.
  cpu::CacheBudget b = cpu::cache_budget(t, 0);
  if (b.bytes == 0) return fmt::format("the cache budget is 0 (chosen by {})", b.chosen_by);
  const std::string k = kernels_dir(exe);
  if (!k.empty() && !fs::exists(exe.stats().so_path)) return "its compiled kernels were not kept (over the cache budget)";
  const uint64_t bytes = exe.saved_bytes() + (k.empty() ? 0 : cpu::folder_bytes(k));
  if (bytes <= b.bytes) return {};
  b = cpu::cache_budget(t, cpu::total_bytes(cpu::list_cache(cpu::cache_directory(t))));
  if (cpu::fits_budget(bytes, b, "the executable-cache entry " + entry.string())) return {};
  return fmt::format("its {} bytes are over the cache budget of {} bytes (chosen by {})", bytes, b.bytes, b.chosen_by);
}

}  // namespace

ImportedModel import_model_file(const std::string& path, const std::vector<Tensor>& inputs, bool symbolic_inputs) {
  ImportedModel m;
  if (is_text_model(path)) {
    // A regular file within the allocation limit: a FIFO or /dev/zero named .tsl is refused, not read forever.
    const std::string file = resolve_model(path).model;
    m.graph = parse_graph(read_regular_file(file, "model file"), file);
    m.producer = "tessel text";
  } else {
    ImportOptions io;
    io.symbolic_inputs = symbolic_inputs;
    if (!symbolic_inputs)
      for (const auto& t : inputs) io.input_shapes.push_back(t.shape());
    m = import_onnx(resolve_model(path).model, io);
  }
  try {
    verify_graph(*m.graph);
  } catch (const Error& e) {
    throw e.with_context(Location{.file = path});
  }
  return m;
}

ModelCompile compile_model_cpu(const std::string& path, const std::vector<Tensor>& ex, const ModelCompileOptions& opts,
                               ImportedModel* imported) {
  const auto t0 = Clock::now();
  ModelCompile r;
  CompiledBackendOptions bo = opts.backend;
  const int threads = resolve_threads(bo.threads);
  // The steps below, with a ticker: the C++ compiler's one long run returns to no loop.
  ProgressOptions po;
  if (!opts.progress) po.mode = ProgressMode::quiet;
  po.eta = false;  // steps of very different lengths: no rate
  Progress progress("compile " + display_text(fs::path(path).filename().string()), 4, "steps", po);
  progress.note("hashing the model");
  std::optional<ProgressTicker> ticker;  // a thread only when something may be shown
  if (opts.progress && progress_mode() != ProgressMode::quiet) ticker.emplace(progress);
  fs::path entry;
  if (opts.executable_cache) {
    const auto tk = Clock::now();
    const std::string file = resolve_model(path).model;
    const fs::path exe_dir = fs::path(cpu::cache_directory(bo.toolchain)) / "exe";
    const std::string key = cpu::content_key({kEntryFormat, build_identity(), model_hash(file, exe_dir / "files", opts.trust_file_stat),
                                              inputs_text(ex), options_text(bo, threads), cpu::cpu_features(),
                                              cpu::dnnl_version(false)});
    entry = exe_dir / key;
    r.key_seconds = since(tk);
    // Loaded under the entry's lock, so the pruner leaves it alone; busy: being removed, a miss.
    if (const cpu::EntryUse use(entry.string()); !use.busy() && fs::exists(entry)) {
      try {
        r.exe = load_cpu(entry.string(), ex, bo, key);
        mark_entry_used(entry, *r.exe);
        r.entry_hit = true;
        r.entry_dir = entry.string();
        r.seconds = since(t0);
        return r;
      } catch (const Error& e) {
        r.load_error = e.what();  // a damaged entry: reported once, compiled and replaced
        cpu::report_cache_problem(e, "compiling the model again");
      }
    }
  }
  progress.advance(1, "importing");
  std::unique_ptr<Graph> g;
  if (imported && imported->graph) {
    g = std::move(imported->graph);
  } else {
    const auto ti = Clock::now();
    g = import_model_file(path, ex).graph;
    r.import_seconds = since(ti);
  }
  bo.keep_module = opts.executable_cache;
  progress.advance(1, "passes, fusion, code generation, C++ compiler");
  r.exe = compile_cpu(std::move(g), ex, bo);
  progress.advance(1, "storing in the executable cache");
  if (opts.executable_cache) {
    r.not_stored = r.exe->unsaveable_reason();
    if (r.not_stored.empty()) r.not_stored = over_budget(*r.exe, bo.toolchain, entry);
    if (r.not_stored.empty()) {
      // Written under a temporary name and renamed into place: readers never see half an entry.
      cpu::sweep_stale_temporaries(cpu::cache_directory(bo.toolchain));
      const fs::path tmp = cpu::temporary_name(entry.string());
      std::error_code ec;
      fs::remove_all(tmp, ec);
      cpu::create_private_directories(tmp.string(), ec);
      if (ec) throw Error(Location{.file = tmp.string(), .pass = "executable cache"}, "cannot create: " + ec.message());
      try {
        r.exe->save(tmp.string(), entry.filename().string());
      } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
      }
      // Only an entry found damaged is removed: one another process stored meanwhile is good, and
      // removing it under a reader would make that reader report damage.
      if (!r.load_error.empty()) fs::remove_all(entry, ec);
      if (::rename(tmp.c_str(), entry.c_str()) != 0) fs::remove_all(tmp, ec);  // another process won the race
      mark_entry_used(entry, *r.exe);
      cpu::after_store(cpu::cache_directory(bo.toolchain), entry.string(), "the executable-cache entry " + entry.string(),
                       bo.toolchain);
      if (fs::exists(entry)) r.entry_dir = entry.string();
      else r.not_stored = "over the cache budget";  // larger than its estimate (saved_bytes)
    }
  }
  r.seconds = since(t0);
  return r;
}

std::string default_data_set(const std::string& model) {
  ModelPaths mp = resolve_model(model);
  if (!mp.data_sets.empty()) return mp.data_sets[0];
  import_model_file(model, {}, true);  // (throws naming the file when it is not a model)
  throw Error(Location{.file = model}, "no --inputs given and no test_data_set_0 next to the model");
}

}  // namespace tessel
