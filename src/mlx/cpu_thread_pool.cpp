#include "cpu_thread_pool.h"

#include <algorithm>

namespace mlex {

ThreadPool::ThreadPool(int workers) {
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
}

void ThreadPool::run(int n, const std::function<void(int)>& f) {
  std::lock_guard<std::mutex> one_caller(run_mu_);
  if (n <= 1 || threads_.empty()) {
    for (int i = 0; i < n; ++i) f(i);
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = &f;
    n_ = n;
    next_ = 0;
    remaining_ = n;
    ++generation_;
  }
  wake_.notify_all();
  work();
  std::unique_lock<std::mutex> l(mu_);
  done_.wait(l, [&] { return remaining_ == 0; });
  job_ = nullptr;
}

void ThreadPool::work() {
  while (true) {
    const std::function<void(int)>* job;
    int i;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (job_ == nullptr || next_ >= n_) return;
      job = job_;
      i = next_++;
    }
    (*job)(i);
    std::lock_guard<std::mutex> l(mu_);
    if (--remaining_ == 0) done_.notify_all();
  }
}

void ThreadPool::loop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> l(mu_);
      wake_.wait(l, [&] { return generation_ != seen; });
      seen = generation_;
    }
    work();
  }
}

ThreadPool& pool() {
  // Never destroyed: its threads sleep until the process exits (joining them from a static
  // destructor could race with MLX's own teardown).
  static ThreadPool* p = [] {
    unsigned hw = std::thread::hardware_concurrency();
    int workers = hw > 1 ? static_cast<int>(std::min(hw, 8u)) - 1 : 0;
    return new ThreadPool(workers);
  }();
  return *p;
}

}  // namespace mlex
