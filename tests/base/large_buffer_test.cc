// Tests of AllocateLargeBuffer: sizes and alignments as its contract states, the whole rounded
// size writable (the sanitizer build checks the bounds), and buffers from 2 MiB on advised to
// use huge pages, as the kernel records it for the mapping (/proc/self/smaps, VmFlags "hg").
#include "base/large_buffer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

namespace kvstack {
namespace {

using Buffer = std::unique_ptr<void, LargeBufferFree>;

bool AlignedTo(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

TEST(LargeBufferTest, SmallBuffersAreRoundedToTheirAlignment) {
  for (size_t alignment : {size_t{64}, size_t{4096}}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4097},
                         kHugePageBytes - 1}) {
      size_t rounded = 0;
      const Buffer buffer(AllocateLargeBuffer(bytes, alignment, &rounded));
      ASSERT_NE(buffer, nullptr) << bytes;
      EXPECT_TRUE(AlignedTo(buffer.get(), alignment)) << bytes << " bytes, alignment " << alignment;
      EXPECT_EQ(rounded % alignment, 0u) << bytes;
      EXPECT_GE(rounded, std::max(bytes, size_t{1})) << bytes;
      EXPECT_LT(rounded, std::max(bytes, size_t{1}) + alignment) << bytes;
      std::memset(buffer.get(), 0xA5, rounded);
    }
  }
}

TEST(LargeBufferTest, BuffersFromTwoMiBAreAlignedToHugePages) {
  for (size_t bytes : {kHugePageBytes, kHugePageBytes + 1, 5 * kHugePageBytes / 2}) {
    size_t rounded = 0;
    const Buffer buffer(AllocateLargeBuffer(bytes, 64, &rounded));
    ASSERT_NE(buffer, nullptr) << bytes;
    EXPECT_TRUE(AlignedTo(buffer.get(), kHugePageBytes)) << bytes;
    EXPECT_EQ(rounded % kHugePageBytes, 0u) << bytes;
    EXPECT_GE(rounded, bytes);
    EXPECT_LT(rounded, bytes + kHugePageBytes);
    std::memset(buffer.get(), 0x5A, rounded);
  }
}

// The VmFlags of the mapping that holds `p`, from /proc/self/smaps; empty if none is found.
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= address && address < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

TEST(LargeBufferTest, BuffersFromTwoMiBAreAdvisedHugePages) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  const Buffer large(AllocateLargeBuffer(4 * kHugePageBytes, 64));
  ASSERT_NE(large, nullptr);
  std::memset(large.get(), 1, 4 * kHugePageBytes);
  const std::string flags = VmFlagsOf(large.get());
  ASSERT_FALSE(flags.empty()) << "no mapping in /proc/self/smaps holds the buffer";
  EXPECT_NE(flags.find(" hg "), std::string::npos) << "VmFlags:" << flags;
}

}  // namespace
}  // namespace kvstack
