#include "cpu_thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mlex {
namespace {

// How long a worker (or the caller) spins before it sleeps: MLEX_POOL_SPIN_US, default 100.
std::chrono::microseconds spin_time() {
  static const std::chrono::microseconds t = [] {
    const char* v = std::getenv("MLEX_POOL_SPIN_US");
    long us = v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : 100;
    return std::chrono::microseconds(std::clamp(us, 0L, 100000L));
  }();
  return t;
}

inline void relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until `ready()` or the spin time has passed; whether it became ready.
template <class F>
bool spin_until(F ready) {
  const auto spin = spin_time();
  if (spin.count() == 0) return ready();
  const auto until = std::chrono::steady_clock::now() + spin;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= until) return ready();
  }
}

}  // namespace

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
    remaining_.store(n);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  work();
  if (!spin_until([&] { return remaining_.load() == 0; })) {
    std::unique_lock<std::mutex> l(mu_);
    done_.wait(l, [&] { return remaining_.load() == 0; });
  }
  std::lock_guard<std::mutex> l(mu_);
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
    if (remaining_.fetch_sub(1) == 1) done_.notify_all();
  }
}

void ThreadPool::loop() {
  uint64_t seen = 0;
  while (true) {
    if (!spin_until([&] { return generation_.load() != seen; })) {
      std::unique_lock<std::mutex> l(mu_);
      wake_.wait(l, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load();
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
