// The thread pool a benchmark runs with, one per thread count, made on first use and kept for
// the whole run (so that starting threads is not timed); null for one thread.
#pragma once

#include <map>
#include <memory>

#include "base/thread_pool.h"

namespace kvstack {

inline ThreadPool* BenchPool(int num_threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  if (num_threads <= 1) return nullptr;
  auto& pool = pools[num_threads];
  if (!pool) pool = std::make_unique<ThreadPool>(num_threads);
  return pool.get();
}

}  // namespace kvstack
