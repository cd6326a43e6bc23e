// GgufFile: parses and validates a GGUF v2/v3 file (header, metadata, tensor infos) over a
// byte span that is either memory-mapped from a file or borrowed from the caller. Every read
// goes through a bounded cursor, and every count or length is checked against the bytes that
// remain before anything is allocated, so a malformed or hostile file yields a Status, never an
// out-of-bounds read or a huge allocation. Tensor data is validated (in bounds, aligned, not
// overlapping) here so that TensorData() can hand out spans without further checks.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstack/check.h"
#include "kvstack/gguf.h"
#include "model/q8_0.h"

namespace kvstack {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
// Arrays of arrays are legal; a bound on nesting keeps a hostile file from exhausting the stack.
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxDims = 4;

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

// What a read is for, formatted only when the read fails: prefix + name + suffix, e.g.
// {"type of key '", key, "'"}. Building the message eagerly would cost an allocation per value.
struct What {
  const char* prefix;
  std::string_view name = {};
  const char* suffix = "";
  uint64_t idx = 0;  // appended when has_idx
  bool has_idx = false;
};

std::string Describe(const What& w) {
  std::string s = absl::StrFormat("%s%s%s", w.prefix, w.name, w.suffix);
  if (w.has_idx) absl::StrAppend(&s, w.idx);
  return s;
}

// A cursor over the file bytes. Every read is checked against the end; errors name what was
// being read and at which offset.
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  absl::StatusOr<T> Read(const What& what) {
    if (remaining() < sizeof(T)) return Truncated(what, sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // A GGUF string: uint64 length, then that many bytes (not NUL-terminated).
  absl::StatusOr<std::string> ReadString(const What& what) {
    const size_t start = pos_;
    KVS_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "gguf: %s at offset %d has length %d, but only %d bytes remain in the file",
          Describe(what), start, len, remaining()));
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  absl::Status Truncated(const What& what, size_t need) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: file truncated reading %s at offset %d (needs %d bytes, %d remain)",
                        Describe(what), pos_, need, remaining()));
  }

 private:
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
};

// The smallest number of bytes one serialized value of `type` occupies; used to reject
// element counts that the rest of the file could not possibly hold, before allocating.
uint64_t MinValueBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString:  // the uint64 length
      return 8;
    case GgufValueType::kArray:  // element type + uint64 count
      return 12;
  }
  return 1;
}

bool IsKnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool IsFloatType(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

std::string_view ValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

absl::StatusOr<GgufValueType> ReadValueType(Cursor& cur, std::string_view key) {
  const size_t at = cur.pos();
  KVS_ASSIGN_OR_RETURN(uint32_t raw, cur.Read<uint32_t>(What{"type of key '", key, "'"}));
  if (!IsKnownValueType(raw)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: key '%s' has unknown value type %d at offset %d (known types are 0..12)", key, raw,
        at));
  }
  return static_cast<GgufValueType>(raw);
}

// Reads one value of `type` (the type id has already been read).
absl::StatusOr<GgufValue> ReadValue(Cursor& cur, GgufValueType type, std::string_view key,
                                    int depth) {
  const What value_what{"value of key '", key, "'"};
  GgufValue out;
  out.type = type;
  switch (type) {
    case GgufValueType::kUint8: {
      KVS_ASSIGN_OR_RETURN(uint8_t v, cur.Read<uint8_t>(value_what));
      out.value = uint64_t{v};
      break;
    }
    case GgufValueType::kInt8: {
      KVS_ASSIGN_OR_RETURN(int8_t v, cur.Read<int8_t>(value_what));
      out.value = int64_t{v};
      break;
    }
    case GgufValueType::kUint16: {
      KVS_ASSIGN_OR_RETURN(uint16_t v, cur.Read<uint16_t>(value_what));
      out.value = uint64_t{v};
      break;
    }
    case GgufValueType::kInt16: {
      KVS_ASSIGN_OR_RETURN(int16_t v, cur.Read<int16_t>(value_what));
      out.value = int64_t{v};
      break;
    }
    case GgufValueType::kUint32: {
      KVS_ASSIGN_OR_RETURN(uint32_t v, cur.Read<uint32_t>(value_what));
      out.value = uint64_t{v};
      break;
    }
    case GgufValueType::kInt32: {
      KVS_ASSIGN_OR_RETURN(int32_t v, cur.Read<int32_t>(value_what));
      out.value = int64_t{v};
      break;
    }
    case GgufValueType::kUint64: {
      KVS_ASSIGN_OR_RETURN(uint64_t v, cur.Read<uint64_t>(value_what));
      out.value = v;
      break;
    }
    case GgufValueType::kInt64: {
      KVS_ASSIGN_OR_RETURN(int64_t v, cur.Read<int64_t>(value_what));
      out.value = v;
      break;
    }
    case GgufValueType::kFloat32: {
      KVS_ASSIGN_OR_RETURN(float v, cur.Read<float>(value_what));
      out.value = double{v};
      break;
    }
    case GgufValueType::kFloat64: {
      KVS_ASSIGN_OR_RETURN(double v, cur.Read<double>(value_what));
      out.value = v;
      break;
    }
    case GgufValueType::kBool: {
      const size_t at = cur.pos();
      KVS_ASSIGN_OR_RETURN(uint8_t v, cur.Read<uint8_t>(value_what));
      if (v > 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "gguf: key '%s' is a bool with value %d at offset %d (allowed: 0 or 1)", key, v, at));
      }
      out.value = v != 0;
      break;
    }
    case GgufValueType::kString: {
      KVS_ASSIGN_OR_RETURN(std::string s, cur.ReadString(What{"string value of '", key, "'"}));
      out.value = std::move(s);
      break;
    }
    case GgufValueType::kArray: {
      if (depth >= kMaxArrayDepth) {
        return absl::InvalidArgumentError(
            absl::StrFormat("gguf: key '%s' nests arrays deeper than %d levels at offset %d", key,
                            kMaxArrayDepth, cur.pos()));
      }
      KVS_ASSIGN_OR_RETURN(out.array_type, ReadValueType(cur, key));
      const size_t at = cur.pos();
      KVS_ASSIGN_OR_RETURN(uint64_t count, cur.Read<uint64_t>(What{"array length of '", key, "'"}));
      const uint64_t min_bytes = MinValueBytes(out.array_type);
      if (count > cur.remaining() / min_bytes) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "gguf: key '%s' claims %d array elements of type %s at offset %d, more than the %d "
            "remaining bytes can hold",
            key, count, ValueTypeName(out.array_type), at, cur.remaining()));
      }
      std::vector<GgufValue> elems;
      elems.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        KVS_ASSIGN_OR_RETURN(GgufValue v, ReadValue(cur, out.array_type, key, depth + 1));
        elems.push_back(std::move(v));
      }
      out.value = std::move(elems);
      break;
    }
  }
  return out;
}

// Bytes of a tensor of `type` with these dims, or an error (Q8_0 rows must be whole blocks).
absl::StatusOr<uint64_t> TensorBytes(const std::string& name, GgmlType type,
                                     const std::vector<int64_t>& dims, uint64_t num_elements) {
  switch (type) {
    case GgmlType::kF32:
      return num_elements * 4;  // num_elements < 2^62 was checked by the caller
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return num_elements * 2;
    case GgmlType::kQ8_0:
      if (dims[0] % kQ8_0BlockSize != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "gguf: tensor '%s' is q8_0 with row length %d, which is not a multiple of the block "
            "size %d",
            name, dims[0], kQ8_0BlockSize));
      }
      return num_elements / kQ8_0BlockSize * kQ8_0BlockBytes;
  }
  KVS_CHECK(false);  // the caller only passes known types
  return 0;
}

}  // namespace

std::string_view GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return "f32";
    case GgmlType::kF16:
      return "f16";
    case GgmlType::kQ8_0:
      return "q8_0";
    case GgmlType::kBF16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  auto prefixed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(
        err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kInvalidArgument,
        absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return prefixed(absl::InvalidArgumentError("gguf: file is empty"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (map == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": mmap failed: ", std::strerror(map_err)));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->mapping_ = map;
  file->mapping_size_ = size;
  file->bytes_ = std::span<const std::byte>(static_cast<const std::byte*>(map), size);
  if (absl::Status s = file->ParseAll(); !s.ok()) return prefixed(s);
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(std::span<const std::byte> bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = bytes;
  KVS_RETURN_IF_ERROR(file->ParseAll());
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

absl::Status GgufFile::ParseAll() {
  Cursor cur(bytes_);
  const size_t file_size = bytes_.size();

  // Header.
  KVS_ASSIGN_OR_RETURN(uint32_t magic, cur.Read<uint32_t>(What{"magic"}));
  if (magic != kGgufMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: bad magic 0x%08x at offset 0 (expected \"GGUF\", 0x%08x)", magic, kGgufMagic));
  }
  KVS_ASSIGN_OR_RETURN(version_, cur.Read<uint32_t>(What{"version"}));
  if (version_ != 2 && version_ != 3) {
    // A byte-swapped small number means a big-endian file, which GGUF v3 allows.
    const bool big_endian = version_ >= (1u << 16) && (version_ & 0xffffu) == 0;
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: version %d is not supported (supported: 2 and 3%s)", version_,
        big_endian ? "; this looks like a big-endian file, only little-endian is supported" : ""));
  }
  KVS_ASSIGN_OR_RETURN(uint64_t num_tensors, cur.Read<uint64_t>(What{"tensor count"}));
  KVS_ASSIGN_OR_RETURN(uint64_t num_kv, cur.Read<uint64_t>(What{"metadata count"}));
  // Lower bounds on the serialized size of one entry, to reject absurd counts up front:
  // a key/value is at least a length, a type and one byte; a tensor info at least a name
  // length, n_dims, one dim, a type and an offset.
  constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
  constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
  if (num_kv > cur.remaining() / kMinKvBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: metadata count %d is more than the remaining %d bytes of the file can hold", num_kv,
        cur.remaining()));
  }
  if (num_tensors > cur.remaining() / kMinTensorInfoBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: tensor count %d is more than the remaining %d bytes of the file can hold",
        num_tensors, cur.remaining()));
  }

  // Metadata.
  metadata_.clear();
  metadata_.reserve(num_kv);
  std::unordered_set<std::string> keys;
  for (uint64_t i = 0; i < num_kv; ++i) {
    const size_t at = cur.pos();
    KVS_ASSIGN_OR_RETURN(std::string key,
                         cur.ReadString(What{"key of metadata entry ", {}, "", i, true}));
    if (!keys.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: duplicate metadata key '%s' at offset %d", key, at));
    }
    KVS_ASSIGN_OR_RETURN(GgufValueType type, ReadValueType(cur, key));
    KVS_ASSIGN_OR_RETURN(GgufValue value, ReadValue(cur, type, key, 0));
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  alignment_ = kDefaultAlignment;
  if (Find("general.alignment") != nullptr) {
    absl::StatusOr<int64_t> a = GetInt("general.alignment");
    if (!a.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gguf: general.alignment must be an integer: ", a.status().message()));
    }
    if (*a <= 0 || (*a & (*a - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: general.alignment is %d; it must be a non-zero power of two", *a));
    }
    alignment_ = static_cast<uint64_t>(*a);
  }

  // Tensor infos.
  tensors_.clear();
  tensors_.reserve(num_tensors);
  std::unordered_set<std::string> names;
  for (uint64_t i = 0; i < num_tensors; ++i) {
    GgufTensorInfo info;
    const size_t at = cur.pos();
    KVS_ASSIGN_OR_RETURN(info.name, cur.ReadString(What{"name of tensor ", {}, "", i, true}));
    if (!names.insert(info.name).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: duplicate tensor name '%s' at offset %d", info.name, at));
    }
    const std::string what = absl::StrCat("tensor '", info.name, "'");
    KVS_ASSIGN_OR_RETURN(uint32_t num_dims, cur.Read<uint32_t>(What{"n_dims of ", what}));
    if (num_dims < 1 || num_dims > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: %s has %d dimensions (allowed: 1..%d)", what, num_dims, kMaxDims));
    }
    // Elements are bounded by 2^62 so that byte counts (at most 4 per element) fit in 64 bits.
    constexpr uint64_t kMaxElements = uint64_t{1} << 62;
    uint64_t num_elements = 1;
    for (uint32_t d = 0; d < num_dims; ++d) {
      KVS_ASSIGN_OR_RETURN(uint64_t dim, cur.Read<uint64_t>(What{"a dim of ", what}));
      if (dim == 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("gguf: %s has dimension %d of size 0 (sizes must be >= 1)", what, d));
      }
      if (dim > kMaxElements / num_elements) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "gguf: %s has too many elements: dims overflow at dimension %d (size %d)", what, d,
            dim));
      }
      num_elements *= dim;
      info.dims.push_back(static_cast<int64_t>(dim));
    }
    info.num_elements = num_elements;
    const size_t type_at = cur.pos();
    KVS_ASSIGN_OR_RETURN(uint32_t type, cur.Read<uint32_t>(What{"type of ", what}));
    switch (static_cast<GgmlType>(type)) {
      case GgmlType::kF32:
      case GgmlType::kF16:
      case GgmlType::kQ8_0:
      case GgmlType::kBF16:
        info.type = static_cast<GgmlType>(type);
        break;
      default:
        return absl::InvalidArgumentError(absl::StrFormat(
            "gguf: %s has unsupported ggml type %d at offset %d (supported: f32=0, f16=1, "
            "q8_0=8, bf16=30)",
            what, type, type_at));
    }
    KVS_ASSIGN_OR_RETURN(info.num_bytes,
                         TensorBytes(info.name, info.type, info.dims, num_elements));
    KVS_ASSIGN_OR_RETURN(info.offset, cur.Read<uint64_t>(What{"offset of ", what}));
    if (info.offset % alignment_ != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: %s data offset %d is not a multiple of the alignment %d", what,
                          info.offset, alignment_));
    }
    tensors_.push_back(std::move(info));
  }

  // Tensor data starts at the end of the header rounded up to the alignment.
  const uint64_t header_end = cur.pos();
  const uint64_t pad = (alignment_ - header_end % alignment_) % alignment_;
  data_offset_ = header_end + pad;  // header_end <= file size, pad < alignment <= 2^63
  for (const GgufTensorInfo& info : tensors_) {
    const bool past_end = data_offset_ > file_size || info.offset > file_size - data_offset_ ||
                          info.num_bytes > file_size - data_offset_ - info.offset;
    if (past_end) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "gguf: tensor '%s' data [offset %d, %d bytes] extends past end of file (%d bytes)",
          info.name, data_offset_ + info.offset, info.num_bytes, file_size));
    }
  }
  // Overlap: sorted by offset, each range must end before the next begins.
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensorInfo& info : tensors_) by_offset.push_back(&info);
  // Stable, so that ties are reported in file order.
  std::stable_sort(
      by_offset.begin(), by_offset.end(),
      [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& prev = *by_offset[i - 1];
    const GgufTensorInfo& next = *by_offset[i];
    if (prev.offset + prev.num_bytes > next.offset) {  // both in bounds: no overflow
      return absl::InvalidArgumentError(absl::StrFormat(
          "gguf: tensors '%s' [offset %d, %d bytes] and '%s' [offset %d, %d bytes] overlap",
          prev.name, prev.offset, prev.num_bytes, next.name, next.offset, next.num_bytes));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

absl::Status NotFound(std::string_view key) {
  return absl::NotFoundError(absl::StrFormat("gguf: metadata key '%s' not found", key));
}

absl::Status WrongType(std::string_view key, const GgufValue& v, std::string_view wanted) {
  std::string have(ValueTypeName(v.type));
  if (v.type == GgufValueType::kArray)
    have = absl::StrFormat("%s of %s", have, ValueTypeName(v.array_type));
  return absl::InvalidArgumentError(
      absl::StrFormat("gguf: metadata key '%s' is %s, expected %s", key, have, wanted));
}

// Integer value of an integer-typed scalar; uint64 values above INT64_MAX do not fit.
absl::StatusOr<int64_t> AsInt(std::string_view key, const GgufValue& v) {
  if (!IsIntegerType(v.type)) return WrongType(key, v, "an integer");
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: metadata key '%s' value %d does not fit in int64", key, *u));
    }
    return static_cast<int64_t>(*u);
  }
  return std::get<int64_t>(v.value);
}

absl::StatusOr<double> AsFloat(std::string_view key, const GgufValue& v) {
  if (IsFloatType(v.type)) return std::get<double>(v.value);
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v.value)) return static_cast<double>(*i);
  return WrongType(key, v, "a float or integer");
}

}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  return AsInt(key, *v);
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  return AsFloat(key, *v);
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kString) return WrongType(key, *v, "a string");
  return std::get<std::string>(v->value);
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kArray || v->array_type != GgufValueType::kString) {
    return WrongType(key, *v, "an array of string");
  }
  const auto& elems = std::get<std::vector<GgufValue>>(v->value);
  std::vector<std::string> out;
  out.reserve(elems.size());
  for (const GgufValue& e : elems) out.push_back(std::get<std::string>(e.value));
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kArray ||
      !(IsFloatType(v->array_type) || IsIntegerType(v->array_type))) {
    return WrongType(key, *v, "an array of float or integer");
  }
  const auto& elems = std::get<std::vector<GgufValue>>(v->value);
  std::vector<float> out;
  out.reserve(elems.size());
  for (const GgufValue& e : elems) {
    KVS_ASSIGN_OR_RETURN(double d, AsFloat(key, e));
    out.push_back(static_cast<float>(d));
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kArray || !IsIntegerType(v->array_type)) {
    return WrongType(key, *v, "an array of integer");
  }
  const auto& elems = std::get<std::vector<GgufValue>>(v->value);
  std::vector<int64_t> out;
  out.reserve(elems.size());
  for (const GgufValue& e : elems) {
    KVS_ASSIGN_OR_RETURN(int64_t i, AsInt(key, e));
    out.push_back(i);
  }
  return out;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  for (const GgufTensorInfo& info : tensors_) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::span<const std::byte> GgufFile::TensorData(const GgufTensorInfo& info) const {
  // Bounds were validated in ParseAll; info must be one of this file's tensors.
  KVS_CHECK(data_offset_ + info.offset + info.num_bytes <= bytes_.size());
  return bytes_.subspan(data_offset_ + info.offset, info.num_bytes);
}

uint64_t GgufFile::ContentHash() const { return XXH3_64bits(bytes_.data(), bytes_.size()); }

}  // namespace kvstack
