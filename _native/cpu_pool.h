// Parallel loops on XLA's intra-op thread pool, shared by the CPU custom calls.
//
// A handler sets `t_pool` for the duration of its call (`PoolScope`); `parallel_for` then runs
// items on the calling thread plus pool tasks (plain threads when no pool is set).
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <sched.h>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace native_cpu {

namespace ffi = xla::ffi;

// Worker threads per call; 0 means every core this process may run on.
inline std::atomic<int> g_threads{0};

// The cores of this process's affinity mask (a container's or `taskset`'s share), which may be
// fewer than the machine's.
inline int usable_cores() {
  static const int cores = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return cores;
}

inline int thread_count() {
  int n = g_threads.load();
  return n > 0 ? n : usable_cores();
}

// XLA's intra-op thread pool for the call running on this thread (null outside a call).
inline thread_local ffi::ThreadPool* t_pool = nullptr;

// Work shared by the caller and the pool tasks. Tasks hold it by shared_ptr: one that starts
// after all items are claimed touches nothing else, so the caller never waits for a task to
// start, only for claimed items to finish.
struct Shared {
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  int n = 0;
  std::function<void(int)> fn;

  void work() {
    for (int i = next++; i < n; i = next++) {
      fn(i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Runs fn(0..n) on the calling thread and up to thread_count() - 1 tasks of XLA's pool (or
// plain threads when there is no pool).
template <typename Fn>
void parallel_for(int n, const Fn& fn) {
  int helpers = std::min(thread_count(), n) - 1;
  if (t_pool != nullptr) helpers = std::min<int64_t>(helpers, t_pool->num_threads());
  if (helpers <= 0) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  auto shared = std::make_shared<Shared>();
  shared->n = n;
  shared->fn = [&fn](int i) { fn(i); };
  std::vector<std::thread> threads;
  for (int h = 0; h < helpers; ++h) {
    if (t_pool != nullptr) {
      t_pool->Schedule([shared] { shared->work(); });
    } else {
      threads.emplace_back([shared] { shared->work(); });
    }
  }
  shared->work();
  while (shared->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
  for (auto& t : threads) t.join();
}

// Makes `pool` the pool of this thread's parallel loops until the scope ends.
struct PoolScope {
  explicit PoolScope(ffi::ThreadPool& pool) { t_pool = &pool; }
  ~PoolScope() { t_pool = nullptr; }
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;
};

}  // namespace native_cpu
