// ThreadPool implementation. One Run() is one "generation": the caller publishes the loop
// (fn_, num_tasks_, next_task_ = 0) and opens it by making generation_ odd; threads claim task
// indices from the atomic next_task_ until they run out; the caller then closes the generation
// (generation_ even again) and waits until no worker is inside the loop. Completion is tracked by
// busy_workers_ (workers currently inside a generation), not by a barrier on every worker, so a
// worker that wakes late finds the generation closed (or all tasks claimed) and goes back to
// waiting without delaying the caller.
//
// Why the close step: a worker announces itself (busy_workers_ += 1) and only then re-checks
// that the generation it saw is still open. All of these are sequentially consistent, so either
// the re-check sees the close (the worker backs off without touching fn_ / num_tasks_) or its
// announcement precedes the close and the caller's final wait for busy_workers_ == 0 sees it.
// Hence no worker reads fn_ / num_tasks_ once Run() has returned and the next Run() may rewrite
// them with plain stores.
#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "kvstack/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvstack {
namespace {

// How long an idle worker polls generation_ before sleeping on the condition variable. A
// decode step issues its loops a few microseconds apart; sleeping between them would cost a
// futex wake-up (tens of microseconds under load) per loop.
constexpr auto kSpinTime = std::chrono::microseconds(40);
// Polls between two reads of the clock while spinning.
constexpr int kPollsPerClockRead = 64;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

inline bool IsOpen(uint64_t generation) { return (generation & 1) != 0; }

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  KVS_CHECK(num_threads >= 0);
  if (num_threads == 0) {
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  num_threads_ = num_threads;
  workers_.reserve(num_threads_ - 1);
  for (int thread_idx = 1; thread_idx < num_threads_; ++thread_idx) {
    workers_.emplace_back([this, thread_idx] { WorkerLoop(thread_idx); });
  }
}

ThreadPool::~ThreadPool() {
  {
    // Under the mutex, so that a worker between its predicate check and its wait cannot miss it.
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::Run(int64_t num_tasks,
                     const std::function<void(int64_t task_idx, int thread_idx)>& fn) {
  if (num_tasks <= 0) return;
  if (num_threads_ == 1 || num_tasks == 1) {
    // Nothing to share: waking workers would only add latency.
    for (int64_t task_idx = 0; task_idx < num_tasks; ++task_idx) fn(task_idx, 0);
    return;
  }
  // busy_workers_ may be non-zero here: a late worker of the previous loop that is about to see
  // it closed. It touches none of the fields written below.
  fn_ = &fn;
  num_tasks_ = num_tasks;
  next_task_.store(0);
  {
    // Opening under the mutex pairs with the predicate check of a worker about to sleep.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1);  // even -> odd: open
  }
  wake_.notify_all();

  Drain(0);

  generation_.fetch_add(1);  // odd -> even: closed; late workers back off from here on
  // Workers still inside are finishing tasks they claimed; none can claim a new one.
  int polls = 0;
  while (busy_workers_.load() != 0) {
    if (++polls < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();  // a worker was descheduled mid-task; let it run
    }
  }
  fn_ = nullptr;
}

void ThreadPool::ParallelFor(
    int64_t n, int64_t min_per_thread,
    const std::function<void(int64_t begin, int64_t end, int thread_idx)>& fn) {
  if (n <= 0) return;
  if (n <= min_per_thread || num_threads_ == 1) {
    fn(0, n, 0);
    return;
  }
  // Each range gets at least min_per_thread items, and there are at most num_threads_ ranges.
  const int64_t max_ranges = n / std::max<int64_t>(1, min_per_thread);
  const int64_t num_ranges = std::clamp<int64_t>(max_ranges, 1, num_threads_);
  Run(num_ranges, [&](int64_t range_idx, int thread_idx) {
    const int64_t begin = n * range_idx / num_ranges;
    const int64_t end = n * (range_idx + 1) / num_ranges;
    fn(begin, end, thread_idx);
  });
}

void ThreadPool::WorkerLoop(int thread_idx) {
  uint64_t seen = 0;  // the last generation this worker looked at
  auto has_work = [&](uint64_t generation) { return IsOpen(generation) && generation != seen; };
  while (true) {
    uint64_t generation = generation_.load();
    if (!has_work(generation) && !stop_.load()) {
      // Spin first: the next loop of a decode step is usually microseconds away.
      const auto spin_end = std::chrono::steady_clock::now() + kSpinTime;
      for (int polls = 1;; ++polls) {
        generation = generation_.load();
        if (has_work(generation) || stop_.load()) break;
        if (polls % kPollsPerClockRead == 0 && std::chrono::steady_clock::now() >= spin_end) {
          std::unique_lock<std::mutex> lock(mu_);
          wake_.wait(lock, [&] {
            generation = generation_.load();
            return has_work(generation) || stop_.load();
          });
          break;
        }
        CpuRelax();
      }
    }
    if (stop_.load()) return;
    seen = generation;
    busy_workers_.fetch_add(1);
    // Re-check after announcing ourselves (see the file comment): only an open generation that
    // is still the one we saw may be entered.
    if (generation_.load() == generation) Drain(thread_idx);
    busy_workers_.fetch_sub(1);
  }
}

void ThreadPool::Drain(int thread_idx) {
  const std::function<void(int64_t, int)>& fn = *fn_;
  const int64_t num_tasks = num_tasks_;
  while (true) {
    // relaxed would do for the claim itself; the default ordering keeps the reasoning simple and
    // costs nothing measurable next to a task.
    const int64_t task_idx = next_task_.fetch_add(1);
    if (task_idx >= num_tasks) return;
    fn(task_idx, thread_idx);
  }
}

}  // namespace kvstack
