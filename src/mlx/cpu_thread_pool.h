// A small persistent thread pool for our CPU kernels: MLX's CPU backend runs each op on one
// thread, so a kernel that wants the other cores brings its own workers.
//
// A decode step runs a pooled kernel every few tens of microseconds (each quantized matvec), and
// waking a sleeping worker through the kernel costs about as much. So a worker that has just
// finished spins for a short while (MLEX_POOL_SPIN_US, default 100 µs; 0: never) before it
// sleeps, and so does the caller waiting for the last task; on a machine busy with other work
// that is at most that long per kernel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlex {

class ThreadPool {
 public:
  explicit ThreadPool(int workers);
  // Workers plus the calling thread.
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs f(0) … f(n-1), the calling thread taking a share, and returns when all have finished.
  void run(int n, const std::function<void(int)>& f);

 private:
  void work();
  void loop();

  std::vector<std::thread> threads_;
  std::mutex run_mu_, mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int n_ = 0, next_ = 0;
  std::atomic<int> remaining_{0};
  std::atomic<uint64_t> generation_{0};
};

// The process's pool: one worker per core but one (at most 7), created on first use.
ThreadPool& pool();

}  // namespace mlex
