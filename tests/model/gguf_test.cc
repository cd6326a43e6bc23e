// Tests for the GGUF reader and writer: round trips of every metadata type and tensor type,
// alignment, typed getters, Open/ContentHash, and a table of malformed files (each a valid
// file with a few bytes corrupted) that must be rejected with a message naming the problem.
// The same table seeds the fuzz corpus: run with KVS_WRITE_FUZZ_CORPUS=<dir> (normally
// fuzz/corpus/gguf) to regenerate it.
#include "kvstack/gguf.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstack/check.h"
#include "kvstack/numeric.h"
#include "kvstack/random_model.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

using Bytes = std::vector<std::byte>;

// absl's string_view is not std::string_view in Debian's build; matchers want a std::string.
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Little-endian byte building for hand-made files and for patching serialized ones.
struct Raw {
  Bytes b;
  template <typename T>
  Raw& Put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  Raw& Str(std::string_view s) {
    Put<uint64_t>(s.size());
    for (char c : s) b.push_back(static_cast<std::byte>(c));
    return *this;
  }
  Raw& Header(uint64_t num_tensors, uint64_t num_kv, uint32_t version = 3) {
    Put<uint32_t>(0x46554747).Put<uint32_t>(version).Put<uint64_t>(num_tensors);
    return Put<uint64_t>(num_kv);
  }
  Raw& Key(std::string_view key, GgufValueType type) {
    return Str(key).Put<uint32_t>(static_cast<uint32_t>(type));
  }
};

template <typename T>
void Patch(Bytes& bytes, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

// Offset of the first occurrence of a GGUF string (length + bytes) in `bytes`.
size_t FindString(const Bytes& bytes, std::string_view s) {
  Raw r;
  r.Str(s);
  auto it = std::search(bytes.begin(), bytes.end(), r.b.begin(), r.b.end());
  KVS_CHECK(it != bytes.end());
  return it - bytes.begin();
}

// Field offsets of the tensor info named `name` in a serialized file.
struct TensorInfoAt {
  size_t n_dims, dims, type, offset;
};
TensorInfoAt FindTensorInfo(const Bytes& bytes, std::string_view name) {
  TensorInfoAt at;
  at.n_dims = FindString(bytes, name) + 8 + name.size();
  uint32_t n_dims;
  std::memcpy(&n_dims, bytes.data() + at.n_dims, 4);
  at.dims = at.n_dims + 4;
  at.type = at.dims + 8 * n_dims;
  at.offset = at.type + 4;
  return at;
}

// Offset of the value-type field of metadata key `key`.
size_t FindKeyType(const Bytes& bytes, std::string_view key) {
  return FindString(bytes, key) + 8 + key.size();
}

Bytes F32Bytes(const std::vector<float>& v) {
  Bytes out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

Bytes U16Bytes(const std::vector<uint16_t>& v) {
  Bytes out(v.size() * 2);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A small valid file: a few keys and tensors of every type.
GgufWriter BaseWriter() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("answer", 42);
  w.AddInt32("negative", -7);
  w.AddFloat32("pi", 3.25f);
  w.AddBool("flag", true);
  w.AddStringArray("words", {"word", "", "\xe2\x96\x81x"});
  w.AddFloat32Array("floats", {0.5f, -1.0f});
  w.AddInt32Array("ints", {1, -2, 3});
  w.AddTensor("a", GgmlType::kF32, {4, 2}, F32Bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  w.AddTensor("b", GgmlType::kF16, {3}, U16Bytes({F32ToF16(1), F32ToF16(-2), F32ToF16(0.5f)}));
  w.AddTensor("c", GgmlType::kBF16, {2, 1, 1}, U16Bytes({F32ToBF16(3), F32ToBF16(-4)}));
  Bytes q8(34);
  const uint16_t scale = F32ToF16(0.25f);
  std::memcpy(q8.data(), &scale, 2);
  for (int i = 0; i < 32; ++i) q8[2 + i] = static_cast<std::byte>(static_cast<int8_t>(i - 16));
  w.AddTensor("d", GgmlType::kQ8_0, {32, 1, 1, 1}, q8);
  return w;
}

TEST(GgufTest, RoundTripsMetadataAndTensors) {
  const GgufWriter w = BaseWriter();
  const Bytes bytes = w.Serialize();
  auto file = GgufFile::Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.metadata().size(), 8u);
  EXPECT_EQ(f.metadata()[1].first, "answer");  // file order is kept
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("answer"), 42);
  EXPECT_EQ(*f.GetInt("negative"), -7);
  EXPECT_EQ(*f.GetFloat("pi"), 3.25);
  EXPECT_EQ(*f.GetFloat("answer"), 42.0);  // integers widen to float
  EXPECT_EQ(std::get<bool>(f.Find("flag")->value), true);
  EXPECT_THAT(*f.GetStringArray("words"), ::testing::ElementsAre("word", "", "\xe2\x96\x81x"));
  EXPECT_THAT(*f.GetFloatArray("floats"), ::testing::ElementsAre(0.5f, -1.0f));
  EXPECT_THAT(*f.GetIntArray("ints"), ::testing::ElementsAre(1, -2, 3));
  EXPECT_THAT(*f.GetFloatArray("ints"), ::testing::ElementsAre(1.0f, -2.0f, 3.0f));

  ASSERT_EQ(f.tensors().size(), 4u);
  const GgufTensorInfo* a = f.FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a->num_elements, 8u);
  EXPECT_EQ(a->num_bytes, 32u);
  float a_vals[8];
  std::memcpy(a_vals, f.TensorData(*a).data(), 32);
  EXPECT_EQ(a_vals[7], 8.0f);
  EXPECT_EQ(f.FindTensor("b")->num_bytes, 6u);
  EXPECT_EQ(f.FindTensor("c")->type, GgmlType::kBF16);
  const GgufTensorInfo* d = f.FindTensor("d");
  EXPECT_EQ(d->num_bytes, 34u);
  EXPECT_EQ(d->dims.size(), 4u);
  EXPECT_EQ(static_cast<int8_t>(f.TensorData(*d)[2 + 31]), 15);
  EXPECT_EQ(f.FindTensor("missing"), nullptr);
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    // Data lies where the writer put it: the span points into `bytes`.
    EXPECT_GE(f.TensorData(t).data(), bytes.data());
    EXPECT_LE(f.TensorData(t).data() + t.num_bytes, bytes.data() + bytes.size());
  }
}

TEST(GgufTest, TypedGettersReportMissingKeysAndWrongTypes) {
  const Bytes bytes = BaseWriter().Serialize();
  auto file = GgufFile::Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_TRUE(absl::IsNotFound(f.GetInt("nope").status()));
  EXPECT_THAT(Msg(f.GetInt("nope").status()), HasSubstr("'nope' not found"));
  EXPECT_TRUE(absl::IsInvalidArgument(f.GetInt("pi").status()));
  EXPECT_THAT(Msg(f.GetInt("pi").status()), HasSubstr("'pi' is float32"));
  EXPECT_THAT(Msg(f.GetString("answer").status()), HasSubstr("expected a string"));
  EXPECT_THAT(Msg(f.GetFloat("general.architecture").status()), HasSubstr("is string"));
  EXPECT_THAT(Msg(f.GetStringArray("ints").status()), HasSubstr("array of int32"));
  EXPECT_FALSE(f.GetIntArray("floats").ok());
  EXPECT_FALSE(f.GetFloatArray("words").ok());
  EXPECT_FALSE(f.GetStringArray("answer").ok());
}

TEST(GgufTest, ReadsEveryValueTypeIncludingNestedArrays) {
  Raw r;
  r.Header(0, 14, /*version=*/2);  // v2 has the same layout as v3
  r.Key("u8", GgufValueType::kUint8).Put<uint8_t>(250);
  r.Key("i8", GgufValueType::kInt8).Put<int8_t>(-100);
  r.Key("u16", GgufValueType::kUint16).Put<uint16_t>(60000);
  r.Key("i16", GgufValueType::kInt16).Put<int16_t>(-30000);
  r.Key("u32", GgufValueType::kUint32).Put<uint32_t>(4000000000u);
  r.Key("i32", GgufValueType::kInt32).Put<int32_t>(-2000000000);
  r.Key("f32", GgufValueType::kFloat32).Put<float>(1.5f);
  r.Key("bool", GgufValueType::kBool).Put<uint8_t>(0);
  r.Key("str", GgufValueType::kString).Str("hello");
  r.Key("u64", GgufValueType::kUint64).Put<uint64_t>(~uint64_t{0});
  r.Key("i64", GgufValueType::kInt64).Put<int64_t>(std::numeric_limits<int64_t>::min());
  r.Key("f64", GgufValueType::kFloat64).Put<double>(-0.125);
  // [[1, 2], []] as an array of arrays of uint16.
  r.Key("nested", GgufValueType::kArray).Put<uint32_t>(9).Put<uint64_t>(2);
  r.Put<uint32_t>(2).Put<uint64_t>(2).Put<uint16_t>(1).Put<uint16_t>(2);
  r.Put<uint32_t>(2).Put<uint64_t>(0);
  r.Key("u8s", GgufValueType::kArray).Put<uint32_t>(0).Put<uint64_t>(3);
  r.Put<uint8_t>(7).Put<uint8_t>(8).Put<uint8_t>(9);
  auto file = GgufFile::Parse(r.b);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(*f.GetInt("u8"), 250);
  EXPECT_EQ(*f.GetInt("i8"), -100);
  EXPECT_EQ(*f.GetInt("u16"), 60000);
  EXPECT_EQ(*f.GetInt("i16"), -30000);
  EXPECT_EQ(*f.GetInt("u32"), 4000000000);
  EXPECT_EQ(*f.GetInt("i32"), -2000000000);
  EXPECT_EQ(*f.GetFloat("f32"), 1.5);
  EXPECT_EQ(std::get<bool>(f.Find("bool")->value), false);
  EXPECT_EQ(*f.GetString("str"), "hello");
  EXPECT_THAT(Msg(f.GetInt("u64").status()), HasSubstr("does not fit in int64"));
  EXPECT_EQ(*f.GetFloat("u64"), 18446744073709551615.0);
  EXPECT_EQ(*f.GetInt("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f.GetFloat("f64"), -0.125);
  const GgufValue* nested = f.Find("nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->array_type, GgufValueType::kArray);
  const auto& outer = std::get<std::vector<GgufValue>>(nested->value);
  ASSERT_EQ(outer.size(), 2u);
  EXPECT_EQ(outer[0].array_type, GgufValueType::kUint16);
  const auto& inner = std::get<std::vector<GgufValue>>(outer[0].value);
  ASSERT_EQ(inner.size(), 2u);
  EXPECT_EQ(std::get<uint64_t>(inner[1].value), 2u);
  EXPECT_TRUE(std::get<std::vector<GgufValue>>(outer[1].value).empty());
  EXPECT_FALSE(f.GetIntArray("nested").ok());
  EXPECT_THAT(*f.GetIntArray("u8s"), ::testing::ElementsAre(7, 8, 9));
}

class GgufAlignmentTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(GgufAlignmentTest, DataIsAlignedAndReadBack) {
  const uint64_t alignment = GetParam();
  const Bytes bytes = BaseWriter().Serialize(alignment);
  auto file = GgufFile::Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->alignment(), alignment);
  EXPECT_EQ((*file)->Find("general.alignment") != nullptr, alignment != 32);
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    EXPECT_EQ(t.offset % alignment, 0u) << t.name;
    // The data section starts aligned too, so every tensor's absolute position is aligned.
    EXPECT_EQ(((*file)->TensorData(t).data() - bytes.data()) % alignment, 0u) << t.name;
  }
  const GgufTensorInfo* a = (*file)->FindTensor("a");
  float last;
  std::memcpy(&last, (*file)->TensorData(*a).data() + 28, 4);
  EXPECT_EQ(last, 8.0f);
  const GgufTensorInfo* d = (*file)->FindTensor("d");
  EXPECT_EQ(static_cast<int8_t>((*file)->TensorData(*d)[2]), -16);
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufAlignmentTest, ::testing::Values(1, 8, 32, 64, 4096));

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".gguf"))
      .string();
}

TEST(GgufTest, OpenMapsTheFileAndHashesItsContent) {
  const std::string path = TempPath("gguf_open");
  const GgufWriter w = BaseWriter();
  ASSERT_TRUE(w.WriteFile(path, 64).ok());
  const Bytes bytes = w.Serialize(64);
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->file_size(), bytes.size());  // WriteFile and Serialize agree
  EXPECT_EQ((*file)->ContentHash(), XXH3_64bits(bytes.data(), bytes.size()));
  const GgufTensorInfo* b = (*file)->FindTensor("b");
  uint16_t h;
  std::memcpy(&h, (*file)->TensorData(*b).data() + 2, 2);
  EXPECT_EQ(F16ToF32(h), -2.0f);
  // One byte of tensor data changed: same structure, different hash.
  Bytes changed = bytes;
  changed.back() ^= std::byte{1};
  auto other = GgufFile::Parse(changed);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->ContentHash(), (*file)->ContentHash());
  std::filesystem::remove(path);
}

TEST(GgufTest, OpenErrorsNameThePath) {
  const std::string missing = TempPath("gguf_missing");
  auto file = GgufFile::Open(missing);
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(absl::IsNotFound(file.status()));
  EXPECT_THAT(Msg(file.status()), HasSubstr(missing));

  const std::string bad = TempPath("gguf_bad");
  std::ofstream(bad) << "GGUF but not really";
  file = GgufFile::Open(bad);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(Msg(file.status()), HasSubstr(bad + ": gguf: "));
  std::ofstream(bad, std::ios::trunc).close();
  EXPECT_THAT(Msg(GgufFile::Open(bad).status()), HasSubstr("empty"));
  std::filesystem::remove(bad);
}

TEST(GgufTest, EveryTruncationIsRejected) {
  const Bytes bytes = BaseWriter().Serialize();
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto file = GgufFile::Parse(std::span(bytes.data(), len));
    ASSERT_FALSE(file.ok()) << "prefix of " << len << " bytes parsed";
    const std::string msg = Msg(file.status());
    EXPECT_TRUE(msg.find("truncated") != msg.npos || msg.find("past end of file") != msg.npos ||
                msg.find("remain") != msg.npos)
        << len << ": " << msg;
  }
}

// One malformed file: a valid one with a few bytes changed (or a hand-made one).
struct MalformedCase {
  std::string name;
  std::function<Bytes()> make;
  std::string expected;  // substring of the error message
};

Bytes Base() { return BaseWriter().Serialize(); }

std::vector<MalformedCase> MalformedCases() {
  std::vector<MalformedCase> cases;
  auto add = [&](std::string name, std::function<Bytes()> make, std::string expected) {
    cases.push_back({std::move(name), std::move(make), std::move(expected)});
  };
  add(
      "bad_magic",
      [] {
        Bytes b = Base();
        Patch<uint32_t>(b, 0, 0x46554746);
        return b;
      },
      "bad magic");
  add(
      "version_1",
      [] {
        Bytes b = Base();
        Patch<uint32_t>(b, 4, 1);
        return b;
      },
      "version 1 is not supported");
  add(
      "big_endian",
      [] {
        Bytes b = Base();
        Patch<uint32_t>(b, 4, 0x03000000);
        return b;
      },
      "big-endian");
  add(
      "truncated_header",
      [] {
        Bytes b = Base();
        b.resize(12);
        return b;
      },
      "truncated reading tensor count");
  add(
      "truncated_metadata",
      [] {
        Bytes b = Base();
        b.resize(FindKeyType(b, "ints") + 2);
        return b;
      },
      "truncated reading type of key 'ints'");
  add(
      "truncated_tensor_info",
      [] {
        Bytes b = Base();
        b.resize(FindTensorInfo(b, "c").dims + 3);
        return b;
      },
      "truncated reading a dim of tensor 'c'");
  add(
      "truncated_data",
      [] {
        Bytes b = Base();
        b.resize(b.size() - 1);
        return b;
      },
      "tensor 'd' data");
  add(
      "huge_tensor_count",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, 8, uint64_t{1} << 60);
        return b;
      },
      "tensor count 1152921504606846976");
  add(
      "huge_kv_count",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, 16, ~uint64_t{0});
        return b;
      },
      "metadata count");
  add(
      "huge_key_length",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindString(b, "answer"), uint64_t{1} << 62);
        return b;
      },
      "key of metadata entry 1 at offset");
  add(
      "huge_string_value",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindKeyType(b, "general.architecture") + 4, uint64_t{1} << 40);
        return b;
      },
      "string value of 'general.architecture' at offset");
  add(
      "huge_array_length",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindKeyType(b, "ints") + 8, uint64_t{1} << 60);
        return b;
      },
      "'ints' claims 1152921504606846976 array elements");
  add(
      "unknown_value_type",
      [] {
        Bytes b = Base();
        Patch<uint32_t>(b, FindKeyType(b, "pi"), 13);
        return b;
      },
      "key 'pi' has unknown value type 13");
  add(
      "unknown_array_type",
      [] {
        Bytes b = Base();
        Patch<uint32_t>(b, FindKeyType(b, "ints") + 4, 99);
        return b;
      },
      "unknown value type 99");
  add(
      "bad_bool",
      [] {
        Bytes b = Base();
        Patch<uint8_t>(b, FindKeyType(b, "flag") + 4, 2);
        return b;
      },
      "bool with value 2");
  add(
      "unknown_ggml_type",
      [] {
        Bytes b = Base();
        Patch<uint32_t>(b, FindTensorInfo(b, "b").type, 2);
        return b;
      },
      "tensor 'b' has unsupported ggml type 2");
  add(
      "zero_dim",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindTensorInfo(b, "a").dims + 8, 0);
        return b;
      },
      "tensor 'a' has dimension 1 of size 0");
  add(
      "too_many_dims",
      [] {
        Bytes b = Base();
        Patch<uint32_t>(b, FindTensorInfo(b, "a").n_dims, 5);
        return b;
      },
      "tensor 'a' has 5 dimensions (allowed: 1..4)");
  add(
      "no_dims",
      [] {
        Bytes b = Base();
        Patch<uint32_t>(b, FindTensorInfo(b, "a").n_dims, 0);
        return b;
      },
      "tensor 'a' has 0 dimensions");
  add(
      "dims_overflow",
      [] {
        Bytes b = Base();
        const TensorInfoAt at = FindTensorInfo(b, "c");
        Patch<uint64_t>(b, at.dims + 8, uint64_t{1} << 40);
        Patch<uint64_t>(b, at.dims + 16, uint64_t{1} << 40);
        return b;
      },
      "tensor 'c' has too many elements");
  add(
      "q8_0_partial_block",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindTensorInfo(b, "d").dims, 16);
        return b;
      },
      "not a multiple of the block size 32");
  add(
      "offset_out_of_bounds",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindTensorInfo(b, "b").offset, 1 << 20);
        return b;
      },
      "tensor 'b' data [offset");
  add(
      "offset_overflow",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindTensorInfo(b, "b").offset, ~uint64_t{31});
        return b;
      },
      "extends past end of file");
  add(
      "misaligned_offset",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindTensorInfo(b, "b").offset, 33);
        return b;
      },
      "tensor 'b' data offset 33 is not a multiple of the alignment 32");
  add(
      "overlapping_tensors",
      [] {
        Bytes b = Base();
        Patch<uint64_t>(b, FindTensorInfo(b, "c").offset, 32);
        return b;
      },
      "tensors 'b' [offset 32, 6 bytes] and 'c' [offset 32, 4 bytes] overlap");
  add(
      "alignment_not_power_of_two",
      [] {
        GgufWriter w = BaseWriter();
        w.AddUint32("general.alignment", 48);
        return w.Serialize();
      },
      "general.alignment is 48; it must be a non-zero power of two");
  add(
      "alignment_zero",
      [] {
        GgufWriter w = BaseWriter();
        w.AddUint32("general.alignment", 0);
        return w.Serialize();
      },
      "general.alignment is 0");
  add(
      "alignment_not_integer",
      [] {
        GgufWriter w = BaseWriter();
        w.AddString("general.alignment", "32");
        return w.Serialize();
      },
      "general.alignment must be an integer");
  add(
      "duplicate_key",
      [] {
        GgufWriter w = BaseWriter();
        w.AddUint32("answer", 43);
        return w.Serialize();
      },
      "duplicate metadata key 'answer'");
  add(
      "duplicate_tensor",
      [] {
        GgufWriter w = BaseWriter();
        w.AddTensor("a", GgmlType::kF32, {1}, F32Bytes({0}));
        return w.Serialize();
      },
      "duplicate tensor name 'a'");
  add(
      "arrays_too_deep",
      [] {
        Raw r;
        r.Header(0, 1).Key("deep", GgufValueType::kArray);
        for (int i = 0; i < 9; ++i) r.Put<uint32_t>(9).Put<uint64_t>(1);
        r.Put<uint32_t>(0).Put<uint64_t>(0);
        return r.b;
      },
      "key 'deep' nests arrays deeper than 8 levels");
  return cases;
}

class GgufMalformedTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(GgufMalformedTest, IsRejectedWithAMessageNamingTheProblem) {
  const Bytes bytes = GetParam().make();
  auto file = GgufFile::Parse(bytes);
  ASSERT_FALSE(file.ok()) << GetParam().name << " parsed";
  EXPECT_TRUE(absl::IsInvalidArgument(file.status())) << file.status();
  EXPECT_THAT(Msg(file.status()), HasSubstr(GetParam().expected));
  EXPECT_THAT(Msg(file.status()), ::testing::StartsWith("gguf: "));
}

INSTANTIATE_TEST_SUITE_P(Cases, GgufMalformedTest, ::testing::ValuesIn(MalformedCases()),
                         [](const auto& info) { return info.param.name; });

TEST(GgufTest, NestingUpToTheLimitIsAccepted) {
  Raw r;
  r.Header(0, 1).Key("deep", GgufValueType::kArray);
  for (int i = 0; i < 7; ++i) r.Put<uint32_t>(9).Put<uint64_t>(1);
  r.Put<uint32_t>(0).Put<uint64_t>(0);
  auto file = GgufFile::Parse(r.b);
  EXPECT_TRUE(file.ok()) << file.status();
}

// Regenerates the fuzz seed corpus: the valid base file, a tiny random llama model and every
// malformed case. Skipped unless KVS_WRITE_FUZZ_CORPUS names the output directory.
TEST(GgufTest, WriteFuzzCorpus) {
  const char* dir = std::getenv("KVS_WRITE_FUZZ_CORPUS");
  if (dir == nullptr) GTEST_SKIP() << "set KVS_WRITE_FUZZ_CORPUS=<dir> to write the corpus";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const Bytes& bytes) {
    std::ofstream out(std::filesystem::path(dir) / (name + ".gguf"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    ASSERT_TRUE(out.good()) << name;
  };
  write("valid_base", Base());
  write("valid_align_1", BaseWriter().Serialize(1));
  RandomModelSpec spec;
  spec.num_layers = 1;
  spec.dim = 8;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.ffn_dim = 16;
  spec.vocab_size = 260;
  spec.context_length = 64;
  const std::string model = (std::filesystem::path(dir) / "valid_tiny_llama.gguf").string();
  ASSERT_TRUE(WriteRandomLlamaModel(spec, model).ok());
  for (const MalformedCase& c : MalformedCases()) write("bad_" + c.name, c.make());
}

}  // namespace
}  // namespace kvstack
