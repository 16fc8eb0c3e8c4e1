// ONNX importer over libonnx's protobuf classes.
#include "tessel/frontend/onnx/importer.h"

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <onnx/onnx_pb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <optional>
#include <set>

#include "tessel/frontend/onnx/expand.h"
#include "tessel/support/escape.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"
#include "tessel/support/limits.h"
#include "tessel/support/pages.h"

namespace tessel {
namespace fs = std::filesystem;

namespace {

std::string_view onnx_type_name(int t) { return onnx_dtype_name(t); }

// ---- reading model and tensor files ----
//
// Most of a model file is the initializers' raw_data. Parsing the file with protobuf copies each of
// them into a std::string, and converting copies it again into the tensor; on a virtual machine
// every fresh 4 KiB page costs a fault, which made importing a 28 MB model take ~0.6 s. Instead the
// file is read as a stream of protobuf fields (FileReader, split_*): everything but the
// initializers' raw_data is copied into a small buffer that protobuf parses, and each raw_data is
// left in the file as a span (offset, length) that is then read straight into one buffer holding
// every initializer (WeightBuffer, huge pages when large), which the tensors share without a copy.
// Anything the stream reader does not expect falls back to protobuf parsing the whole file, so a
// corrupt file gives the same errors as before.

// An open regular file, closed on scope exit. Anything else (a directory, FIFO, device such as
// /dev/zero, socket) and a file larger than the allocation limit are refused before a byte is read:
// reading them could not end, or would allocate without bound. O_NONBLOCK: opening a FIFO does not
// wait for a writer.
class Fd {
 public:
  explicit Fd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {
    if (fd_ < 0) fail("cannot open file");
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail("cannot open file");
    if (!S_ISREG(st.st_mode)) fail("is {}; expected a file", file_kind(st.st_mode));
    size_ = static_cast<uint64_t>(st.st_size);
    check_alloc(size_, "reading the file");
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  uint64_t size() const { return size_; }

  // Reads up to `n` bytes at `offset` into `dst`; returns how many (fewer only at the end of file).
  size_t read_at(void* dst, size_t n, uint64_t offset) const {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, static_cast<char*>(dst) + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("cannot read file: {}", std::strerror(errno));
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  }

  // The whole file.
  std::string read_all() const {
    std::string out(static_cast<size_t>(size_), '\0');
    out.resize(read_at(out.data(), out.size(), 0));
    return out;
  }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Sequential reading of a file's bytes through a small buffer; skip() passes over bytes without
// reading them. Every read is bounded by `limit`: false means the bytes end before it.
class FileReader {
 public:
  explicit FileReader(const Fd& fd) : fd_(fd), size_(fd.size()), buf_(kBuf) {}
  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }

  bool byte(uint8_t& b, uint64_t limit) {
    if (pos_ >= limit || !fill()) return false;
    b = static_cast<uint8_t>(buf_[pos_ - buf_pos_]);
    ++pos_;
    return true;
  }
  bool varint(uint64_t& v, uint64_t limit) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b = 0;
      if (!byte(b, limit)) return false;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;  // more than 10 bytes: not a varint
  }
  // Appends the next `n` bytes to `out`.
  bool copy(uint64_t n, uint64_t limit, std::string& out) {
    if (n > limit - std::min(limit, pos_)) return false;
    while (n > 0) {
      if (!fill()) return false;
      size_t avail = static_cast<size_t>(buf_pos_ + buf_len_ - pos_);
      size_t k = static_cast<size_t>(std::min<uint64_t>(n, avail));
      out.append(buf_.data() + (pos_ - buf_pos_), k);
      pos_ += k;
      n -= k;
    }
    return true;
  }
  bool skip(uint64_t n, uint64_t limit) {
    if (n > limit - std::min(limit, pos_)) return false;
    pos_ += n;
    return true;
  }

 private:
  static constexpr size_t kBuf = 64 << 10;
  // Makes the byte at pos_ available in the buffer; false at the end of the file.
  bool fill() {
    if (pos_ >= buf_pos_ && pos_ < buf_pos_ + buf_len_) return true;
    if (pos_ >= size_) return false;
    buf_pos_ = pos_;
    buf_len_ = fd_.read_at(buf_.data(), static_cast<size_t>(std::min<uint64_t>(kBuf, size_ - pos_)), pos_);
    return buf_len_ > 0;
  }
  const Fd& fd_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::vector<char> buf_;
  uint64_t buf_pos_ = 0;
  size_t buf_len_ = 0;
};

void append_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Where a TensorProto's raw_data is in the file.
struct RawSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
};

enum class WireType { varint = 0, i64 = 1, len = 2, i32 = 5 };

// Reads one field's tag. False at a malformed tag or a wire type other than the four above
// (groups: left to protobuf).
bool read_tag(FileReader& r, uint64_t end, uint64_t& tag, uint64_t& field, WireType& wt) {
  if (!r.varint(tag, end)) return false;
  field = tag >> 3;
  const uint64_t w = tag & 7;
  if (field == 0 || field > 0x1fffffff || (w != 0 && w != 1 && w != 2 && w != 5)) return false;
  wt = static_cast<WireType>(w);
  return true;
}

// Copies the payload of a field whose tag (already copied) was just read.
bool copy_payload(FileReader& r, uint64_t end, WireType wt, std::string& out) {
  switch (wt) {
    case WireType::varint: {
      uint64_t v = 0;
      if (!r.varint(v, end)) return false;
      append_varint(out, v);
      return true;
    }
    case WireType::i64: return r.copy(8, end, out);
    case WireType::i32: return r.copy(4, end, out);
    case WireType::len: {
      uint64_t n = 0;
      if (!r.varint(n, end)) return false;
      append_varint(out, n);
      return r.copy(n, end, out);
    }
  }
  return false;
}

// A length-delimited submessage: its fields are filtered by `inner` into a buffer, then written
// with its new length.
template <typename F>
bool filter_submessage(FileReader& r, uint64_t end, uint64_t tag, std::string& out, F&& inner) {
  uint64_t n = 0;
  if (!r.varint(n, end) || n > end - r.pos()) return false;
  std::string sub;
  if (!inner(r, r.pos() + n, sub)) return false;
  append_varint(out, tag);
  append_varint(out, sub.size());
  out += sub;
  return true;
}

// Field numbers of onnx.proto.
constexpr uint64_t kModelGraph = 7, kGraphInitializer = 5, kTensorRawData = 9;

// A TensorProto up to `end`, without its raw_data, which goes to `span` (the last one wins, as in
// protobuf).
bool split_tensor(FileReader& r, uint64_t end, std::string& out, std::optional<RawSpan>& span) {
  while (r.pos() < end) {
    uint64_t tag = 0, field = 0;
    WireType wt{};
    if (!read_tag(r, end, tag, field, wt)) return false;
    if (field == kTensorRawData && wt == WireType::len) {
      uint64_t n = 0;
      if (!r.varint(n, end)) return false;
      span = RawSpan{r.pos(), n};
      if (!r.skip(n, end)) return false;
      continue;
    }
    append_varint(out, tag);
    if (!copy_payload(r, end, wt, out)) return false;
  }
  return r.pos() == end;
}

// A GraphProto: initializers without their raw_data, whose spans are appended to `spans` in the
// order protobuf will hold the initializers.
bool split_graph(FileReader& r, uint64_t end, std::string& out, std::vector<std::optional<RawSpan>>& spans) {
  while (r.pos() < end) {
    uint64_t tag = 0, field = 0;
    WireType wt{};
    if (!read_tag(r, end, tag, field, wt)) return false;
    if (field == kGraphInitializer && wt == WireType::len) {
      std::optional<RawSpan> span;
      auto inner = [&](FileReader& rr, uint64_t e, std::string& o) { return split_tensor(rr, e, o, span); };
      if (!filter_submessage(r, end, tag, out, inner)) return false;
      spans.push_back(span);
      continue;
    }
    append_varint(out, tag);
    if (!copy_payload(r, end, wt, out)) return false;
  }
  return r.pos() == end;
}

// A ModelProto (graph fields repeated are merged by protobuf, their initializers concatenated).
bool split_model(FileReader& r, std::string& out, std::vector<std::optional<RawSpan>>& spans) {
  const uint64_t end = r.size();
  while (r.pos() < end) {
    uint64_t tag = 0, field = 0;
    WireType wt{};
    if (!read_tag(r, end, tag, field, wt)) return false;
    if (field == kModelGraph && wt == WireType::len) {
      auto inner = [&](FileReader& rr, uint64_t e, std::string& o) { return split_graph(rr, e, o, spans); };
      if (!filter_submessage(r, end, tag, out, inner)) return false;
      continue;
    }
    append_varint(out, tag);
    if (!copy_payload(r, end, wt, out)) return false;
  }
  return true;
}

// One buffer for the raw bytes of many tensors, 64-byte aligned slots, shared by the tensors made
// over it (Tensor::adopt). Its pages come from allocate_pages (huge pages for large buffers: filling
// fresh 4 KiB pages one fault at a time is most of the cost of loading weights on a virtual machine).
class WeightBuffer {
 public:
  static constexpr uint64_t kAlign = 64;
  static uint64_t slot(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  explicit WeightBuffer(uint64_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    Pages pages = allocate_pages(static_cast<size_t>(bytes));
    base_ = pages.get();
    owner_ = std::shared_ptr<void>(pages.release(), pages.get_deleter());
  }

  // A slot for `n` bytes; null when the buffer is full (the caller then allocates on its own).
  uint8_t* take(uint64_t n) {
    if (slot(n) > size_ - used_) return nullptr;
    uint8_t* p = base_ + used_;
    used_ += slot(n);
    return p;
  }
  const std::shared_ptr<void>& owner() const { return owner_; }

 private:
  uint64_t size_ = 0;
  uint64_t used_ = 0;
  uint8_t* base_ = nullptr;
  std::shared_ptr<void> owner_;
};

// A TensorProto's raw_data left in the file by split_model / split_tensor, to be read into a
// WeightBuffer.
struct FileRaw {
  const Fd* fd = nullptr;
  RawSpan span;
  WeightBuffer* weights = nullptr;

  // The bytes, into a string (for the cases that convert them).
  std::string read() const {
    std::string s(static_cast<size_t>(span.length), '\0');
    if (fd->read_at(s.data(), s.size(), span.offset) != s.size()) fail("file is truncated");
    return s;
  }
};

// Bits per element of the types ONNX packs several to a byte (raw_data and int32_data), else 0.
int packed_bits(DType t) {
  switch (t) {
    case DType::i4:
    case DType::u4:
    case DType::f4e2m1: return 4;
    case DType::i2:
    case DType::u2: return 2;
    default: return 0;
  }
}

// Bytes `n` elements of a packed type take (the last byte padded with zero bits).
int64_t packed_bytes(DType t, int64_t n) {
  const int per = 8 / packed_bits(t);
  return (n + per - 1) / per;
}

// Stores the unpacked field `v` (the low bits of one packed element) as element i: integers
// sign-extended or zero-extended to their one-byte form, float4 as its bit pattern.
void set_packed(Tensor& t, int64_t i, uint8_t v) {
  if (t.dtype() == DType::f4e2m1) t.bytes()[i] = v;
  else t.set_i(i, wrap_to_int(t.dtype(), v));
}

// Fills `t` from little-endian packed bytes (ONNX raw_data / external data). Sub-byte types are
// packed lowest bits first: two 4-bit or four 2-bit elements a byte.
void fill_from_raw(Tensor& t, const std::string& raw, const std::string& what) {
  if (int bits = packed_bits(t.dtype())) {
    const size_t need = static_cast<size_t>(packed_bytes(t.dtype(), t.numel()));
    if (raw.size() != need) fail("{}: raw data has {} bytes, expected {}", what, raw.size(), need);
    const int per = 8 / bits;
    const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
    for (int64_t i = 0; i < t.numel(); ++i)
      set_packed(t, i, (static_cast<uint8_t>(raw[i / per]) >> (bits * (i % per))) & mask);
    return;
  }
  if (raw.size() != t.nbytes()) fail("{}: raw data has {} bytes, expected {}", what, raw.size(), t.nbytes());
  if (t.nbytes()) std::memcpy(t.bytes(), raw.data(), raw.size());
}

// How many values a TensorProto holds in the typed field its dtype uses (float_data, int32_data, ...).
int64_t typed_value_count(const onnx::TensorProto& tp, DType dt) {
  switch (dt) {
    case DType::f32: return tp.float_data_size();
    case DType::f64: return tp.double_data_size();
    case DType::i64: return tp.int64_data_size();
    case DType::u32:
    case DType::u64: return tp.uint64_data_size();
    default: return tp.int32_data_size();  // f16, bf16, f8, packed types, i32 and narrower, bool
  }
}

// The bytes the data of `n` elements of `dt` takes in raw_data or an external file.
uint64_t stored_bytes(DType dt, int64_t n) {
  return packed_bits(dt) ? static_cast<uint64_t>(packed_bytes(dt, n)) : static_cast<uint64_t>(n) * dtype_size(dt);
}

// The data a TensorProto carries, checked against what its dims declare before the tensor is
// allocated: dims of 2^31 over a few bytes fail here, at once, instead of after zero-filling
// gigabytes. External data is checked where its file is opened (external_raw).
void check_data_size(const onnx::TensorProto& tp, DType dt, int64_t n, const Shape& shape, const FileRaw* file_raw,
                     const std::string& what) {
  if (tp.data_location() == onnx::TensorProto::EXTERNAL) return;
  const uint64_t want = stored_bytes(dt, n);
  if (file_raw || tp.has_raw_data()) {
    const uint64_t have = file_raw ? file_raw->span.length : tp.raw_data().size();
    if (have != want) fail("{}: raw data has {} bytes, expected {}", what, have, want);
    return;
  }
  const int64_t have = typed_value_count(tp, dt);
  const bool packed_ok = packed_bits(dt) && (have == packed_bytes(dt, n) || (have == n && n > 1));
  if (have != n && !packed_ok) fail("{}: has {} values, its shape {} needs {}", what, have, shape_str(shape), n);
}

// A non-negative integer of an external_data entry ("offset", "length").
int64_t external_int(const std::string& key, const std::string& text, const std::string& what) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || v < 0 || text.empty())
    fail("{}: external data {} '{}' is not a non-negative integer", what, key, text);
  return v;
}

// Where external data at `location` lives: a path relative to the model's folder that stays inside
// it, symbolic links resolved (as the ONNX checker requires), so a model cannot make tessel read
// /etc/passwd or ~/.ssh into a tensor.
fs::path confined_location(const fs::path& base_dir, const std::string& location, const std::string& what) {
  const fs::path loc(location);
  if (loc.is_absolute() || location.find('\0') != std::string::npos)
    fail("{}: external data location '{}' must be a path relative to the model's folder", what, location);
  for (const fs::path& part : loc)
    if (part == "..") fail("{}: external data location '{}' must not leave the model's folder ('..')", what, location);
  std::error_code ec1, ec2;
  const fs::path base = fs::weakly_canonical(base_dir.empty() ? fs::path(".") : base_dir, ec1);
  const fs::path real = fs::weakly_canonical(base_dir / loc, ec2);
  if (ec1 || ec2) fail("{}: cannot resolve external data location '{}'", what, location);
  auto [b, r] = std::mismatch(base.begin(), base.end(), real.begin(), real.end());
  if (b != base.end()) fail("{}: external data location '{}' resolves outside the model's folder", what, location);
  return real;
}

// The bytes of a tensor stored in an external file: the file must be a regular file holding
// `want` bytes at the offset (length, when given, must say the same) before anything is allocated.
std::string external_raw(const onnx::TensorProto& tp, const fs::path& base_dir, uint64_t want, const std::string& what) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : tp.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = external_int("offset", kv.value(), what);
    else if (kv.key() == "length") length = external_int("length", kv.value(), what);
  }
  if (location.empty()) fail("{}: external data without a location", what);
  if (length >= 0 && static_cast<uint64_t>(length) != want)
    fail("{}: external data length is {} bytes, expected {}", what, length, want);
  const fs::path p = confined_location(base_dir, location, what);
  uint64_t size = 0;
  try {
    size = check_regular_file(p.string(), "external data file");
  } catch (const Error& e) {
    fail("{}: {}", what, e.what());
  }
  if (static_cast<uint64_t>(offset) > size || want > size - static_cast<uint64_t>(offset))
    fail("{}: external data file '{}' is too short ({} bytes; {} needed at offset {})", what, p.string(), size, want, offset);
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("{}: cannot open external data file '{}'", what, p.string());
  std::string raw(static_cast<size_t>(want), '\0');
  f.seekg(offset);
  f.read(raw.data(), static_cast<std::streamsize>(want));
  if (static_cast<uint64_t>(f.gcount()) != want) fail("{}: external data file '{}' is too short", what, p.string());
  return raw;
}

// `file_raw`: the tensor's raw_data, left in the file by split_model / split_tensor (the TensorProto
// then has none of its own).
Tensor convert_tensor(const onnx::TensorProto& tp, const fs::path& base_dir, const FileRaw* file_raw = nullptr) {
  const std::string what = tp.name().empty() ? std::string("tensor") : "tensor '" + tp.name() + "'";
  auto dt = dtype_from_onnx(tp.data_type());
  if (!dt) unsupported("{}: data type {} ({}) is not supported", what, onnx_type_name(tp.data_type()), tp.data_type());
  Shape shape;
  for (int64_t d : tp.dims()) {
    if (d < 0) fail("{}: negative dimension {}", what, d);
    shape.push_back(d);
  }
  const int64_t n = checked_tensor_numel(*dt, shape, what);
  check_data_size(tp, *dt, n, shape, file_raw, what);
  if (file_raw && tp.data_location() != onnx::TensorProto::EXTERNAL && !packed_bits(*dt)) {
    // The common case, read from the file straight into the weight buffer: no copy, no zero fill.
    const uint64_t nbytes = stored_bytes(*dt, n);
    uint8_t* p = file_raw->weights ? file_raw->weights->take(nbytes) : nullptr;
    if (p) {
      if (file_raw->fd->read_at(p, static_cast<size_t>(nbytes), file_raw->span.offset) != nbytes)
        fail("{}: raw data is cut short (the file changed while it was read)", what);
      return Tensor::adopt(*dt, std::move(shape), file_raw->weights->owner(), p);
    }
  }
  if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
    const std::string raw = external_raw(tp, base_dir, stored_bytes(*dt, n), what);
    Tensor t(*dt, shape);
    fill_from_raw(t, raw, what);
    return t;
  }
  Tensor t(*dt, shape);
  if (file_raw) {
    fill_from_raw(t, file_raw->read(), what);
    return t;
  }
  if (tp.has_raw_data()) {
    fill_from_raw(t, tp.raw_data(), what);
    return t;
  }
  auto check = [&](int64_t have, int64_t want) {
    if (have != want) fail("{}: has {} values, its shape {} needs {}", what, have, shape_str(shape), want);
  };
  switch (*dt) {
    case DType::f32:
      check(tp.float_data_size(), n);
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = tp.float_data(i);
      break;
    case DType::f64:
      check(tp.double_data_size(), n);
      for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = tp.double_data(i);
      break;
    case DType::i64:
      check(tp.int64_data_size(), n);
      for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = tp.int64_data(i);
      break;
    case DType::u32:
    case DType::u64:
      check(tp.uint64_data_size(), n);
      for (int64_t i = 0; i < n; ++i) t.set_i(i, static_cast<int64_t>(tp.uint64_data(i)));
      break;
    case DType::f16:
    case DType::bf16:
      check(tp.int32_data_size(), n);
      for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = static_cast<uint16_t>(tp.int32_data(i));
      break;
    case DType::f8e4m3fn:
    case DType::f8e4m3fnuz:
    case DType::f8e5m2:
    case DType::f8e5m2fnuz:
    case DType::f8e8m0:
      check(tp.int32_data_size(), n);
      for (int64_t i = 0; i < n; ++i) t.bytes()[i] = static_cast<uint8_t>(tp.int32_data(i));
      break;
    case DType::i4:
    case DType::u4:
    case DType::f4e2m1:
    case DType::i2:
    case DType::u2: {
      // Packed like raw_data, one byte's worth of elements per int32_data entry. Some writers store
      // one element per entry instead; take that form when the count says so.
      const int bits = packed_bits(*dt), per = 8 / bits;
      const uint32_t mask = (1u << bits) - 1;
      if (tp.int32_data_size() == n && n > 1) {
        for (int64_t i = 0; i < n; ++i) set_packed(t, i, static_cast<uint8_t>(tp.int32_data(i) & mask));
      } else {
        check(tp.int32_data_size(), packed_bytes(*dt, n));
        for (int64_t i = 0; i < n; ++i)
          set_packed(t, i, static_cast<uint8_t>((static_cast<uint32_t>(tp.int32_data(i / per)) >> (bits * (i % per))) & mask));
      }
      break;
    }
    default:  // i32, i16, i8, u16, u8, bool
      check(tp.int32_data_size(), n);
      for (int64_t i = 0; i < n; ++i) t.set_i(i, tp.int32_data(i));
      break;
  }
  return t;
}

// Size symbols for the graph inputs' dims that are not numbers (ImportOptions::symbolic_inputs): one
// per distinct dim_param, named after it; a fresh one per dim with neither value nor param.
class InputSymbols {
 public:
  TensorType type_of(const onnx::ValueInfoProto& vi, const TensorType& declared, Graph& g) {
    Dims dims;
    int k = 0;
    if (static_cast<size_t>(vi.type().tensor_type().shape().dim_size()) > kMaxRank)
      fail("graph input '{}' has {} dims, over tessel's rank limit of {}", display_text(vi.name()),
           vi.type().tensor_type().shape().dim_size(), kMaxRank);
    for (const auto& d : vi.type().tensor_type().shape().dim()) {
      if (d.has_dim_value()) {
        if (d.dim_value() < 0) fail("graph input '{}' dim {} is negative ({})", vi.name(), k, d.dim_value());
        dims.push_back(d.dim_value());
      } else {
        const std::string key = d.has_dim_param() && !d.dim_param().empty() ? "param " + d.dim_param() : fmt::format("{} {}", vi.name(), k);
        auto it = by_key_.find(key);
        if (it == by_key_.end()) {
          const std::string base = d.has_dim_param() && !d.dim_param().empty() ? d.dim_param() : fmt::format("{}_d{}", vi.name(), k);
          it = by_key_.emplace(key, fresh_name(base, g)).first;
        }
        dims.push_back(Dim::symbol(it->second));
      }
      ++k;
    }
    return TensorType::of(declared.dtype, dims);
  }

 private:
  std::map<std::string, std::string> by_key_;  // dim_param (or input and dim) -> symbol

  // `base` as a valid symbol name not yet declared in g.
  static std::string fresh_name(const std::string& base, Graph& g) {
    std::string n;
    for (char c : base) n += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_';
    if (n.empty() || std::isdigit(static_cast<unsigned char>(n[0]))) n = "d_" + n;
    if (n.size() > 56) n.resize(56);
    std::string name = n;
    for (int i = 2; g.symbols.find(name); ++i) name = fmt::format("{}_{}", n, i);
    g.symbols.declare(SymbolInfo{name});
    return name;
  }
};

// A value's declared type; nullopt for non-tensor types (sequence, map, optional).
std::optional<TensorType> declared_type(const onnx::ValueInfoProto& vi, bool* has_elem_type) {
  if (!vi.type().has_tensor_type()) return std::nullopt;
  const auto& tt = vi.type().tensor_type();
  TensorType t;
  *has_elem_type = tt.elem_type() != 0;
  if (*has_elem_type) {
    auto dt = dtype_from_onnx(tt.elem_type());
    if (!dt) unsupported("value '{}' has unsupported data type {} ({})", vi.name(), onnx_type_name(tt.elem_type()), tt.elem_type());
    t.dtype = *dt;
  }
  if (tt.has_shape()) {
    if (static_cast<size_t>(tt.shape().dim_size()) > kMaxRank)
      fail("value '{}' has {} dims, over tessel's rank limit of {}", display_text(vi.name()), tt.shape().dim_size(), kMaxRank);
    for (const auto& d : tt.shape().dim()) t.shape.push_back(d.has_dim_value() ? d.dim_value() : kUnknownDim);
  }
  return t;
}

const char* type_case_name(const onnx::TypeProto& t) {
  if (t.has_sequence_type()) return "a sequence";
  if (t.has_map_type()) return "a map";
  if (t.has_optional_type()) return "an optional";
  if (t.has_sparse_tensor_type()) return "a sparse tensor";
  return "not a tensor";
}

Attr convert_attr(const onnx::AttributeProto& a, const AttrSpec* spec, const fs::path& base) {
  using A = onnx::AttributeProto;
  switch (a.type()) {
    case A::FLOAT: return static_cast<double>(a.f());
    case A::INT:
      if (spec && spec->kind == AttrKind::f) return static_cast<double>(a.i());
      return static_cast<int64_t>(a.i());
    case A::STRING: return a.s();
    case A::TENSOR: return convert_tensor(a.t(), base);
    case A::FLOATS: return std::vector<double>(a.floats().begin(), a.floats().end());
    case A::INTS:
      if (spec && spec->kind == AttrKind::floats) return std::vector<double>(a.ints().begin(), a.ints().end());
      return std::vector<int64_t>(a.ints().begin(), a.ints().end());
    case A::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
    case A::GRAPH:
    case A::GRAPHS: unsupported("attribute '{}' is a subgraph; only the ops expanded at import take one (docs/ops.md)", a.name());
    default: unsupported("attribute '{}' has an unsupported attribute type {}", a.name(), static_cast<int>(a.type()));
  }
}

AttrKind kind_of(const Attr& a) { return static_cast<AttrKind>(a.index()); }

Tensor constant_node_value(const onnx::NodeProto& np, const fs::path& base) {
  if (np.attribute_size() != 1) fail("Constant needs exactly one value attribute");
  const auto& a = np.attribute(0);
  const std::string& n = a.name();
  if (n == "value") return convert_tensor(a.t(), base);
  if (n == "value_float") return Tensor::scalar_f(DType::f32, a.f());
  if (n == "value_int") return Tensor::scalar_i(DType::i64, a.i());
  if (n == "value_floats") {
    std::vector<double> v(a.floats().begin(), a.floats().end());
    return Tensor::from_f64(DType::f32, {static_cast<int64_t>(v.size())}, v);
  }
  if (n == "value_ints") {
    std::vector<int64_t> v(a.ints().begin(), a.ints().end());
    return Tensor::from_i64(DType::i64, {static_cast<int64_t>(v.size())}, v);
  }
  unsupported("Constant attribute '{}' is not supported (string and sparse constants)", n);
}

}  // namespace

Tensor read_tensor_pb(const std::string& path) {
  try {
    Fd fd(path);
    onnx::TensorProto tp;
    const fs::path base = fs::path(path).parent_path();
    {
      FileReader r(fd);
      std::string rest;
      std::optional<RawSpan> span;
      if (split_tensor(r, fd.size(), rest, span)) {
        if (!tp.ParseFromString(rest)) fail("not a valid serialized TensorProto (truncated or corrupt)");
        if (!span) return convert_tensor(tp, base);
        WeightBuffer weights(WeightBuffer::slot(span->length));
        FileRaw raw{&fd, *span, &weights};
        return convert_tensor(tp, base, &raw);
      }
    }
    // Not what split_tensor expects: protobuf parses the whole file (and reports what is wrong).
    if (!tp.ParseFromString(fd.read_all())) fail("not a valid serialized TensorProto (truncated or corrupt)");
    return convert_tensor(tp, base);
  } catch (const Error& e) {
    throw e.with_context(Location{.file = path, .pass = "read"});
  }
}

void write_tensor_pb(const Tensor& t, const std::string& name, const std::string& path) {
  onnx::TensorProto tp;
  tp.set_name(name);
  tp.set_data_type(dtype_to_onnx(t.dtype()));
  for (int64_t d : t.shape()) tp.add_dims(d);
  std::string raw;
  if (int bits = packed_bits(t.dtype())) {
    const int per = 8 / bits;
    const unsigned mask = (1u << bits) - 1;
    raw.assign(static_cast<size_t>(packed_bytes(t.dtype(), t.numel())), '\0');
    for (int64_t i = 0; i < t.numel(); ++i)
      raw[i / per] = static_cast<char>(static_cast<uint8_t>(raw[i / per]) | ((t.bytes()[i] & mask) << (bits * (i % per))));
  } else {
    raw.assign(reinterpret_cast<const char*>(t.bytes()), t.nbytes());
  }
  tp.set_raw_data(raw);
  std::ofstream f(path, std::ios::binary);
  if (!f || !tp.SerializeToOstream(&f)) throw Error(Location{.file = path, .pass = "write"}, "cannot write tensor file");
}

namespace {

// Why protobuf refused a model: subgraphs (If/Loop/Scan bodies, three messages a level) nested past its
// default recursion limit of 100 messages parse under a larger limit; anything else is damage.
[[noreturn]] void refuse_model_bytes(const std::string& bytes) {
  if (!bytes.empty() && bytes.size() <= INT_MAX) {
    google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()));
    in.SetRecursionLimit(1000);
    onnx::ModelProto deep;
    if (deep.ParseFromCodedStream(&in) && in.ConsumedEntireMessage() && deep.has_graph())
      unsupported("subgraphs (If/Loop/Scan bodies) are nested deeper than protobuf parses by default (100 "
                  "messages, about 33 levels)");
  }
  fail("not a valid ONNX model (truncated or corrupt protobuf)");
}

}  // namespace

ImportedModel import_onnx(const std::string& path, const ImportOptions& opts) {
  Location file_loc{.file = path, .pass = "import"};
  try {
    if (fs::is_directory(path)) fail("is a directory; expected a .onnx file");
    Fd fd(path);
    onnx::ModelProto model;
    // The initializers' raw_data stays in the file (spans, in initializer order) unless the file
    // is not what split_model expects; then protobuf parses all of it and reports what is wrong.
    std::vector<std::optional<RawSpan>> spans;
    bool split = false;
    if (fd.size() > 0) {
      FileReader r(fd);
      std::string rest;
      split = split_model(r, rest, spans) && rest.size() <= INT_MAX;
      if (split && (!model.ParseFromString(rest) || !model.has_graph())) refuse_model_bytes(rest);
    }
    if (!split) {
      spans.clear();
      std::string bytes = fd.read_all();
      if (bytes.empty() || bytes.size() > INT_MAX || !model.ParseFromString(bytes) || !model.has_graph())
        refuse_model_bytes(bytes);
    }
    const fs::path base = fs::path(path).parent_path();
    const auto& gp = model.graph();
    const OpRegistry& reg = OpRegistry::get();

    ImportedModel out;
    out.producer = model.producer_name() + (model.producer_version().empty() ? "" : " " + model.producer_version());
    std::map<std::string, int> opsets;
    for (const auto& o : model.opset_import()) {
      // (truncated to int, a version of 2^32 + 13 read as 13; the checker refuses versions below 1)
      if (o.version() < 1 || o.version() > 1000)
        fail("opset_import of domain '{}' has version {}: not an opset version (1 to 1000)",
             display_text(o.domain().empty() ? std::string("ai.onnx") : o.domain()), o.version());
      opsets[o.domain() == "ai.onnx" ? "" : o.domain()] = static_cast<int>(o.version());
    }
    out.opset = opsets.count("") ? opsets[""] : 1;

    // Every unsupported op in one message, the subgraphs of ops expanded at import included.
    std::map<std::string, std::vector<std::string>> missing_ops;
    std::function<void(const onnx::GraphProto&, const std::string&)> find_missing =
        [&](const onnx::GraphProto& sg, const std::string& scope) {
          for (int k = 0; k < sg.node_size(); ++k) {
            const auto& np = sg.node(k);
            std::string domain = np.domain() == "ai.onnx" ? "" : np.domain();
            if (np.op_type() == "Constant" && domain.empty()) continue;
            std::string nname = scope + (np.name().empty() ? fmt::format("#{}", k) : np.name());
            if (is_expanded_op(np)) {
              for (const onnx::GraphProto* body : expanded_op_subgraphs(np)) find_missing(*body, nname + "/");
              continue;
            }
            const OpDef* def = reg.find(np.op_type());
            std::string label = np.op_type() + (domain.empty() ? "" : " (" + domain + ")");
            int ver = opsets.count(domain) ? opsets[domain] : 1;
            if (!def || def->domain != domain || (ver < def->since && !def->upgrade))
              missing_ops[label].push_back(ver < (def ? def->since : 0) ? nname + " @opset " + std::to_string(ver) : nname);
          }
        };
    find_missing(gp, "");
    if (!missing_ops.empty()) {
      std::string msg = "unsupported ops: ";
      bool first = true;
      for (const auto& [op, names] : missing_ops) {
        if (!first) msg += "; ";
        first = false;
        msg += op + " (node" + (names.size() > 1 ? "s " : " ");
        for (size_t i = 0; i < names.size() && i < 5; ++i) msg += (i ? ", '" : "'") + names[i] + "'";
        if (names.size() > 5) msg += fmt::format(" and {} more", names.size() - 5);
        msg += ")";
      }
      unsupported("{}", msg);
    }

    auto g = std::make_unique<Graph>();
    g->name = gp.name().empty() ? "main" : gp.name();
    std::map<std::string, Value*> env;
    if (split && spans.size() != static_cast<size_t>(gp.initializer_size()))
      fail("internal: {} raw data spans for {} initializers", spans.size(), gp.initializer_size());
    uint64_t weight_bytes = 0;
    for (const auto& sp : spans)
      if (sp) weight_bytes += WeightBuffer::slot(sp->length);
    WeightBuffer weights(weight_bytes);
    for (int i = 0; i < gp.initializer_size(); ++i) {
      const auto& init = gp.initializer(i);
      if (init.name().empty()) fail("an initializer has no name");
      try {
        std::optional<FileRaw> raw;
        if (split && spans[i]) raw = FileRaw{&fd, *spans[i], &weights};
        env[init.name()] = g->add_constant(init.name(), convert_tensor(init, base, raw ? &*raw : nullptr));
      } catch (const Error& e) {
        throw e.with_context(Location{.node = init.name(), .pass = "import"});
      }
    }
    int input_index = 0;
    InputSymbols symbols;
    for (const auto& vi : gp.input()) {
      if (env.count(vi.name())) continue;  // an initializer listed as input: a constant here
      bool has_elem = false;
      auto t = declared_type(vi, &has_elem);
      if (!t) unsupported("graph input '{}' is {}; only tensors are supported", vi.name(), type_case_name(vi.type()));
      if (!has_elem) fail("graph input '{}' has no element type", vi.name());
      if (opts.symbolic_inputs) {
        if (!vi.type().tensor_type().has_shape()) unsupported("graph input '{}' has no shape (not even a rank) to make symbolic", vi.name());
        *t = symbols.type_of(vi, *t, *g);
      } else if (input_index < static_cast<int>(opts.input_shapes.size()) && opts.input_shapes[input_index]) {
        const Shape& given = *opts.input_shapes[input_index];
        bool ok = given.size() == t->shape.size() || !vi.type().tensor_type().has_shape();
        for (size_t d = 0; ok && d < t->shape.size(); ++d) ok = t->shape[d] < 0 || t->shape[d] == given[d];
        if (!ok) fail("graph input '{}' is declared {} but was given shape {}", vi.name(), t->str(), shape_str(given));
        t->shape = given;
      }
      env[vi.name()] = g->add_input(vi.name(), *t);
      ++input_index;
    }

    // One node into the graph, its inputs looked up and its outputs bound in `scope`. The nodes of
    // an expanded op's subgraphs come through here too (import_body), under the op's node name.
    // The expansions need the types of what is imported so far: inferred as the graph grows.
    InferResult inferred;
    size_t inferred_nodes = 0;
    auto infer_so_far = [&]() -> const InferResult& {
      infer_graph_from(*g, inferred_nodes, inferred);
      inferred_nodes = g->nodes().size();
      return inferred;
    };
    using Env = std::map<std::string, Value*>;
    // ONNX graphs are in SSA form (its checker refuses a second definition): a node output naming a value
    // already defined (an input, an initializer, an earlier output, an outer scope's value, the node's
    // own other output) is an error here, not a silent rebinding of the name.
    auto check_new_names = [](const std::vector<std::string>& outs, const Env& env) {
      std::set<std::string> seen;
      for (const auto& o : outs)
        if (!o.empty() && (env.count(o) || !seen.insert(o).second)) fail("redefines value '{}'", display_text(o));
    };
    std::function<void(const onnx::NodeProto&, const std::string&, Env&)> import_node;
    auto import_body = [&](const onnx::GraphProto& body, const std::vector<Value*>& args, const Env& outer,
                           const std::string& prefix) {
      if (body.input_size() != static_cast<int>(args.size()))
        fail("subgraph '{}' has {} inputs; the op passes {}", body.name(), body.input_size(), args.size());
      Env scope = outer;
      for (int i = 0; i < body.input_size(); ++i) scope[body.input(i).name()] = args[i];
      for (const auto& init : body.initializer())
        scope[init.name()] = g->add_constant(prefix + init.name(), convert_tensor(init, base));
      for (int k = 0; k < body.node_size(); ++k) {
        const auto& np = body.node(k);
        import_node(np, prefix + (np.name().empty() ? fmt::format("{}_{}", np.op_type(), k) : np.name()), scope);
      }
      std::vector<Value*> outs;
      for (const auto& o : body.output()) {
        auto it = scope.find(o.name());
        if (it == scope.end()) fail("subgraph output '{}' is not produced by any node", o.name());
        outs.push_back(it->second);
      }
      return outs;
    };
    import_node = [&](const onnx::NodeProto& np, const std::string& nname, Env& env) {
      try {
        if (np.op_type() == "Constant" && (np.domain().empty() || np.domain() == "ai.onnx")) {
          if (np.output_size() != 1) fail("Constant must have one output");
          check_new_names({np.output(0)}, env);
          env[np.output(0)] = g->add_constant(np.output(0), constant_node_value(np, base));
          return;
        }
        const std::string domain = np.domain() == "ai.onnx" ? "" : np.domain();
        if (is_expanded_op(np)) {
          ExpandCtx ctx{*g, nname, {}, {}, 0, infer_so_far, {}};
          for (const auto& a : np.attribute())
            if (a.type() != onnx::AttributeProto::GRAPH) ctx.attrs[a.name()] = convert_attr(a, nullptr, base);
          for (const auto& in : np.input()) {
            if (in.empty()) {
              ctx.inputs.push_back(nullptr);
              continue;
            }
            auto it = env.find(in);
            if (it == env.end()) fail("uses undefined value '{}'", in);
            ctx.inputs.push_back(it->second);
          }
          std::vector<std::string> outs(np.output().begin(), np.output().end());
          while (!outs.empty() && outs.back().empty()) outs.pop_back();
          check_new_names(outs, env);
          ctx.num_outputs = static_cast<int>(outs.size());
          ctx.import_body = [&](const onnx::GraphProto& body, const std::vector<Value*>& args) {
            return import_body(body, args, env, nname + "/");
          };
          std::vector<Value*> vals = expand_node(ctx, np, opsets.count(domain) ? opsets[domain] : 1);
          for (size_t i = 0; i < outs.size(); ++i)
            if (!outs[i].empty()) {
              if (!vals[i]) fail("output {} is not defined by this form of {}", i, np.op_type());
              env[outs[i]] = vals[i];
            }
          return;
        }
        const OpDef* def = reg.find(np.op_type());
        std::vector<Value*> ins;
        for (const auto& in : np.input()) {
          if (in.empty()) {
            ins.push_back(nullptr);
            continue;
          }
          auto it = env.find(in);
          if (it == env.end()) fail("uses undefined value '{}' (missing initializer or input, or nodes out of order)", in);
          ins.push_back(it->second);
        }
        while (!ins.empty() && !ins.back()) ins.pop_back();
        std::map<std::string, Attr> attrs;
        for (const auto& a : np.attribute()) {
          const AttrSpec* spec = nullptr;
          for (const auto& s : def->attrs)
            if (s.name == a.name()) spec = &s;
          if (!spec) unsupported("unsupported attribute '{}'", a.name());
          Attr v = convert_attr(a, spec, base);
          if (kind_of(v) != spec->kind)
            fail("attribute '{}' must be {} but is {}", a.name(), attr_kind_name(spec->kind), attr_kind_name(kind_of(v)));
          attrs[a.name()] = std::move(v);
        }
        std::vector<std::string> outs(np.output().begin(), np.output().end());
        while (!outs.empty() && outs.back().empty()) outs.pop_back();
        check_new_names(outs, env);
        Node* n = g->add_node(def, nname, std::move(ins), outs, std::move(attrs));
        int ver = opsets.count(def->domain) ? opsets[def->domain] : 1;
        if (ver < def->since) def->upgrade(*g, *n, ver);
        // torchvision's RoiAlign symbolic for the ONNX exporter (opset 11, until it gained one for opset 16
        // that names the mode) writes RoiAlign-10's form, which behaved as output_half_pixel (torch's
        // aligned=False), into models of any opset; from RoiAlign-16 a missing mode means half_pixel, which
        // is not what torch computed (half a pixel apart: Faster R-CNN's box features differ by ~100 %).
        // In a model PyTorch wrote, a RoiAlign without the attribute is read as the exporter meant it.
        if (def->name == "RoiAlign" && def->domain.empty() && ver >= 16 && model.producer_name() == "pytorch" &&
            !n->has_attr("coordinate_transformation_mode")) {
          n->attrs["coordinate_transformation_mode"] = std::string("output_half_pixel");
          out.notes.push_back(fmt::format("RoiAlign '{}' has no coordinate_transformation_mode: read as output_half_pixel, "
                                          "as PyTorch's exporter writes torchvision's roi_align (aligned=False)",
                                          display_text(nname)));
        }
        // The upgrade may have replaced the node's op: check against the op it has now.
        const OpDef* cur = n->op;
        if (static_cast<int>(n->inputs.size()) < cur->min_inputs)
          fail("needs at least {} inputs, got {}", cur->min_inputs, n->inputs.size());
        if (cur->max_inputs >= 0 && static_cast<int>(n->inputs.size()) > cur->max_inputs)
          fail("takes at most {} inputs, got {}", cur->max_inputs, n->inputs.size());
        if (static_cast<int>(n->outputs.size()) > cur->max_outputs)
          fail("has at most {} outputs, got {}", cur->max_outputs, n->outputs.size());
        for (const auto& s : cur->attrs)
          if (s.required && !n->has_attr(s.name)) fail("missing required attribute '{}'", s.name);
        for (size_t i = 0; i < outs.size(); ++i)
          if (!outs[i].empty()) env[outs[i]] = n->outputs[i];
      } catch (const Error& e) {
        throw e.with_context(Location{.node = nname, .op = np.op_type(), .pass = "import"});
      }
    };
    for (int k = 0; k < gp.node_size(); ++k) {
      const auto& np = gp.node(k);
      import_node(np, np.name().empty() ? fmt::format("{}_{}", np.op_type(), k) : np.name(), env);
    }
    std::set<std::string> listed;
    for (const auto& vi : gp.output()) {
      auto it = env.find(vi.name());
      if (it == env.end()) fail("graph output '{}' is not produced by any node", vi.name());
      if (!listed.insert(vi.name()).second) fail("graph output '{}' is listed twice", display_text(vi.name()));
      g->outputs.push_back(it->second);
    }
    infer_graph(*g);
    for (const auto& vi : gp.output()) {
      bool has_elem = false;
      auto t = declared_type(vi, &has_elem);
      if (!t) unsupported("graph output '{}' is {}; only tensors are supported", vi.name(), type_case_name(vi.type()));
      const Value* v = env[vi.name()];
      if (has_elem && t->dtype != v->type.dtype)
        fail("graph output '{}' is declared {} but computes {}", vi.name(), dtype_name(t->dtype), v->type.str());
    }
    out.graph = std::move(g);
    return out;
  } catch (const Error& e) {
    throw e.with_context(file_loc);
  }
}

}  // namespace tessel
