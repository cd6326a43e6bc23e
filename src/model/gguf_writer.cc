// GgufWriter: serializes metadata and tensors as a little-endian GGUF v3 file. Used to write
// random benchmark models, by tests to build valid and (after corrupting the bytes) malformed
// files, and to generate the fuzz corpus. The header is built in memory; WriteFile streams the
// tensor data after it so that a large model is not copied a second time.
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvstack/check.h"
#include "kvstack/gguf.h"
#include "model/q8_0.h"

namespace kvstack {
namespace {

constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;

static_assert(std::endian::native == std::endian::little,
              "the GGUF writer assumes a little-endian host");

class ByteSink {
 public:
  explicit ByteSink(std::vector<std::byte>& out) : out_(out) {}

  template <typename T>
  void Put(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void PutString(std::string_view s) {
    Put<uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  void PadTo(uint64_t alignment) {
    out_.resize((out_.size() + alignment - 1) / alignment * alignment, std::byte{0});
  }

 private:
  std::vector<std::byte>& out_;
};

// Writes a value's payload (not its type id, which the caller writes).
void PutValue(ByteSink& sink, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kUint8:
      sink.Put<uint8_t>(std::get<uint64_t>(v.value));
      break;
    case GgufValueType::kInt8:
      sink.Put<int8_t>(std::get<int64_t>(v.value));
      break;
    case GgufValueType::kUint16:
      sink.Put<uint16_t>(std::get<uint64_t>(v.value));
      break;
    case GgufValueType::kInt16:
      sink.Put<int16_t>(std::get<int64_t>(v.value));
      break;
    case GgufValueType::kUint32:
      sink.Put<uint32_t>(std::get<uint64_t>(v.value));
      break;
    case GgufValueType::kInt32:
      sink.Put<int32_t>(std::get<int64_t>(v.value));
      break;
    case GgufValueType::kUint64:
      sink.Put<uint64_t>(std::get<uint64_t>(v.value));
      break;
    case GgufValueType::kInt64:
      sink.Put<int64_t>(std::get<int64_t>(v.value));
      break;
    case GgufValueType::kFloat32:
      sink.Put<float>(std::get<double>(v.value));
      break;
    case GgufValueType::kFloat64:
      sink.Put<double>(std::get<double>(v.value));
      break;
    case GgufValueType::kBool:
      sink.Put<uint8_t>(std::get<bool>(v.value) ? 1 : 0);
      break;
    case GgufValueType::kString:
      sink.PutString(std::get<std::string>(v.value));
      break;
    case GgufValueType::kArray: {
      const auto& elems = std::get<std::vector<GgufValue>>(v.value);
      sink.Put<uint32_t>(static_cast<uint32_t>(v.array_type));
      sink.Put<uint64_t>(elems.size());
      for (const GgufValue& e : elems) PutValue(sink, e);
      break;
    }
  }
}

uint64_t ExpectedBytes(GgmlType type, const std::vector<int64_t>& dims) {
  uint64_t n = 1;
  for (int64_t d : dims) n *= static_cast<uint64_t>(d);
  switch (type) {
    case GgmlType::kF32:
      return n * 4;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return n * 2;
    case GgmlType::kQ8_0:
      KVS_CHECK(dims[0] % kQ8_0BlockSize == 0);
      return n / kQ8_0BlockSize * kQ8_0BlockBytes;
  }
  KVS_CHECK(false);
  return 0;
}

GgufValue Scalar(GgufValueType type, decltype(GgufValue::value) value) {
  GgufValue v;
  v.type = type;
  v.value = std::move(value);
  return v;
}

template <typename T>
GgufValue Array(GgufValueType elem_type, std::vector<T> elems) {
  std::vector<GgufValue> values;
  values.reserve(elems.size());
  for (T& e : elems) values.push_back(Scalar(elem_type, std::move(e)));
  GgufValue v;
  v.type = GgufValueType::kArray;
  v.array_type = elem_type;
  v.value = std::move(values);
  return v;
}

}  // namespace

void GgufWriter::AddUint32(std::string key, uint32_t v) {
  metadata_.emplace_back(std::move(key), Scalar(GgufValueType::kUint32, uint64_t{v}));
}
void GgufWriter::AddInt32(std::string key, int32_t v) {
  metadata_.emplace_back(std::move(key), Scalar(GgufValueType::kInt32, int64_t{v}));
}
void GgufWriter::AddFloat32(std::string key, float v) {
  metadata_.emplace_back(std::move(key), Scalar(GgufValueType::kFloat32, double{v}));
}
void GgufWriter::AddBool(std::string key, bool v) {
  metadata_.emplace_back(std::move(key), Scalar(GgufValueType::kBool, v));
}
void GgufWriter::AddString(std::string key, std::string v) {
  metadata_.emplace_back(std::move(key), Scalar(GgufValueType::kString, std::move(v)));
}
void GgufWriter::AddStringArray(std::string key, std::vector<std::string> v) {
  metadata_.emplace_back(std::move(key), Array(GgufValueType::kString, std::move(v)));
}
void GgufWriter::AddFloat32Array(std::string key, std::vector<float> v) {
  std::vector<double> d(v.begin(), v.end());
  metadata_.emplace_back(std::move(key), Array(GgufValueType::kFloat32, std::move(d)));
}
void GgufWriter::AddInt32Array(std::string key, std::vector<int32_t> v) {
  std::vector<int64_t> i(v.begin(), v.end());
  metadata_.emplace_back(std::move(key), Array(GgufValueType::kInt32, std::move(i)));
}

void GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                           std::vector<std::byte> data) {
  KVS_CHECK(!dims.empty() && dims.size() <= 4);
  for (int64_t d : dims) KVS_CHECK(d >= 1);
  KVS_CHECK(data.size() == ExpectedBytes(type, dims));
  tensors_.push_back({std::move(name), type, std::move(dims), std::move(data)});
}

namespace {

// The header (everything before the tensor data, padded to the alignment) and each tensor's
// offset in the data section. general.alignment is added when it is not the default, unless the
// caller already set that key (tests use that to write a bad one).
template <typename Tensors>
std::vector<std::byte> SerializeHeader(
    const std::vector<std::pair<std::string, GgufValue>>& metadata, const Tensors& tensors,
    uint64_t alignment, std::vector<uint64_t>& offsets) {
  KVS_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0);
  bool has_alignment_key = false;
  for (const auto& [k, v] : metadata) has_alignment_key |= (k == "general.alignment");
  const bool add_alignment_key = alignment != kDefaultAlignment && !has_alignment_key;

  std::vector<std::byte> out;
  ByteSink sink(out);
  sink.Put<uint32_t>(0x46554747);  // "GGUF"
  sink.Put<uint32_t>(kVersion);
  sink.Put<uint64_t>(tensors.size());
  sink.Put<uint64_t>(metadata.size() + (add_alignment_key ? 1 : 0));
  if (add_alignment_key) {
    sink.PutString("general.alignment");
    sink.Put<uint32_t>(static_cast<uint32_t>(GgufValueType::kUint32));
    sink.Put<uint32_t>(static_cast<uint32_t>(alignment));
  }
  for (const auto& [k, v] : metadata) {
    sink.PutString(k);
    sink.Put<uint32_t>(static_cast<uint32_t>(v.type));
    PutValue(sink, v);
  }
  offsets.clear();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    sink.PutString(t.name);
    sink.Put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) sink.Put<uint64_t>(static_cast<uint64_t>(d));
    sink.Put<uint32_t>(static_cast<uint32_t>(t.type));
    sink.Put<uint64_t>(offset);
    offsets.push_back(offset);
    offset = (offset + t.data.size() + alignment - 1) / alignment * alignment;
  }
  sink.PadTo(alignment);
  return out;
}

}  // namespace

std::vector<std::byte> GgufWriter::Serialize(uint64_t alignment) const {
  std::vector<uint64_t> offsets;
  std::vector<std::byte> out = SerializeHeader(metadata_, tensors_, alignment, offsets);
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + offsets[i], std::byte{0});  // padding before this tensor
    out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path, uint64_t alignment) const {
  std::vector<uint64_t> offsets;
  const std::vector<std::byte> header = SerializeHeader(metadata_, tensors_, alignment, offsets);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open for writing: ", std::strerror(errno)));
  }
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  uint64_t written = 0;  // bytes of the data section so far
  const std::vector<std::byte> zeros(alignment);
  for (size_t i = 0; ok && i < tensors_.size(); ++i) {
    const size_t pad = offsets[i] - written;
    ok = std::fwrite(zeros.data(), 1, pad, f) == pad;
    const std::vector<std::byte>& data = tensors_[i].data;
    ok = ok && std::fwrite(data.data(), 1, data.size(), f) == data.size();
    written = offsets[i] + data.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace kvstack
