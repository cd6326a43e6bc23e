// GGUF: reading (and writing) the model file format of llama.cpp, versions 2 and 3.
// The reader validates everything before anything is used: a malformed file — bad magic,
// truncation, counts or lengths beyond the file, tensor data out of bounds or overlapping,
// unknown types — gets a Status naming the problem, never a crash or an out-of-bounds read.
// Tensor data is memory-mapped (Open) or borrowed from a caller's buffer (Parse).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

// Metadata value types, as numbered in the GGUF specification.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// Tensor element types, as numbered by ggml. Only those kvstack can read are named; the
// reader rejects any other type id with an error naming it.
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30 };
std::string_view GgmlTypeName(GgmlType type);

// A metadata value. Arrays hold their elements (arrays of arrays are allowed by the format).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType array_type = GgufValueType::kUint8;  // element type, for kArray
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (row length)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // relative to the start of the tensor data section
  uint64_t num_elements = 0;
  uint64_t num_bytes = 0;
};

class GgufFile {
 public:
  // Maps and parses a file. Errors name the path and the problem.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes owned by the caller, who keeps them alive as long as the GgufFile.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(std::span<const std::byte> bytes);
  ~GgufFile();

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;

  // Typed getters: NotFound if the key is missing, InvalidArgument if its type does not fit.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;   // any integer type
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // float or integer types
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // The tensor's bytes (validated to lie inside the file at parse time).
  std::span<const std::byte> TensorData(const GgufTensorInfo& info) const;

  // Size of the whole file in bytes and a 64-bit content hash of it (XXH3), for keying
  // calibration profiles and cached results to exactly this model.
  size_t file_size() const { return bytes_.size(); }
  uint64_t ContentHash() const;

 private:
  GgufFile() = default;
  absl::Status ParseAll();

  std::span<const std::byte> bytes_;
  void* mapping_ = nullptr;  // owned mmap, or null when bytes are borrowed
  size_t mapping_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

// Builds a GGUF v3 file in memory: for make-model, for tests and for the fuzz corpus.
class GgufWriter {
 public:
  void AddUint32(std::string key, uint32_t v);
  void AddInt32(std::string key, int32_t v);
  void AddFloat32(std::string key, float v);
  void AddBool(std::string key, bool v);
  void AddString(std::string key, std::string v);
  void AddStringArray(std::string key, std::vector<std::string> v);
  void AddFloat32Array(std::string key, std::vector<float> v);
  void AddInt32Array(std::string key, std::vector<int32_t> v);
  // dims in ggml order (dims[0] innermost); data must hold exactly the tensor's bytes.
  void AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                 std::vector<std::byte> data);
  // The serialized file, data aligned to `alignment` (written as general.alignment when not 32).
  std::vector<std::byte> Serialize(uint64_t alignment = 32) const;
  absl::Status WriteFile(const std::string& path, uint64_t alignment = 32) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::vector<std::byte> data;
  };
  std::vector<PendingTensor> tensors_;
};

}  // namespace kvstack
