// ThreadPool: a fixed set of worker threads for data-parallel loops in the forward pass and
// the attention kernels. The calling thread takes part in every loop, so a pool of N threads
// runs N-1 workers. Workers spin briefly before sleeping: a decode step issues dozens of small
// loops, and waking a sleeping thread costs more than many of them take.
// Run() is not reentrant and must be called from one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvstack {

class ThreadPool {
 public:
  // num_threads >= 1 (the caller counts as one); 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(task_idx, thread_idx) for every task_idx in [0, num_tasks), spread over the
  // threads (thread_idx < num_threads() identifies the calling thread, for per-thread scratch).
  // Returns when all calls have returned.
  void Run(int64_t num_tasks, const std::function<void(int64_t task_idx, int thread_idx)>& fn);

  // Splits [0, n) into about num_threads() contiguous ranges and calls fn(begin, end, thread_idx)
  // on each. n <= min_per_thread runs on the caller alone.
  void ParallelFor(int64_t n, int64_t min_per_thread,
                   const std::function<void(int64_t begin, int64_t end, int thread_idx)>& fn);

 private:
  void WorkerLoop(int thread_idx);
  void Drain(int thread_idx);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> busy_workers_{0};
  int64_t num_tasks_ = 0;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  std::atomic<bool> stop_{false};
};

// Calls fn(task_idx, thread_idx) for every task_idx in [0, n): on `pool`, or on the calling thread
// (as thread 0, with no std::function in between) where there is no pool or only one task.
template <class Fn>
void RunTasks(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (pool == nullptr || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
  } else {
    pool->Run(n, fn);
  }
}

}  // namespace kvstack
