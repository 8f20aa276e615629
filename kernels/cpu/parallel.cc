#include "kernels/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/matmul.h"

namespace ringmaster::kernels {
namespace {

// Workers wait for a generation number to change, run their part of the current call (the
// worker numbered i runs part i, if the call has that many), and count themselves done.
// Started on first use and kept, detached: they sleep between calls.
class Pool {
 public:
  // OpenBLAS's thread count is set to 1 and restored under call_mu_, so that concurrent
  // calls cannot restore each other's 1.
  void Run(int parts, const std::function<void(int)>& part) {
    absl::MutexLock one_call(&call_mu_);
    const int blas_threads = BlasThreads();
    SetBlasThreads(1);
    {
      absl::MutexLock lock(&mu_);
      while (workers_ < parts - 1) {
        ++workers_;
        std::thread([this, index = workers_] { Work(index); }).detach();
      }
      part_ = &part;
      parts_ = parts;
      running_ = parts - 1;
      ++generation_;
    }
    part(0);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* running) { return *running == 0; }, &running_));
    part_ = nullptr;
    SetBlasThreads(blas_threads);
  }

 private:
  void Work(int index) {
    Waiting waiting{this, 0};
    while (true) {
      const std::function<void(int)>* part;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(&Pool::NewCall, &waiting));
        waiting.seen = generation_;
        if (index >= parts_) continue;
        part = part_;
      }
      (*part)(index);
      absl::MutexLock lock(&mu_);
      --running_;
    }
  }
  struct Waiting {
    Pool* pool;
    uint64_t seen;  // the last generation this worker took
  };
  // Await's condition, evaluated with mu_ held.
  static bool NewCall(Waiting* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return w->pool->generation_ != w->seen;
  }

  absl::Mutex call_mu_;  // one call at a time
  absl::Mutex mu_;
  int workers_ ABSL_GUARDED_BY(mu_) = 0;  // started, numbered 1..workers_
  const std::function<void(int)>* part_ ABSL_GUARDED_BY(mu_) = nullptr;
  int parts_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// The process's pool. A child of fork() has none of the parent's workers: it starts a fresh
// pool (the parent's is left as it was in the child's copy, never used again).
Pool* the_pool = nullptr;

Pool& ThePool() {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { the_pool = new Pool(); });
    the_pool = new Pool();
    return true;
  }();
  (void)registered;
  return *the_pool;
}

}  // namespace

void ParallelRun(int parts, const std::function<void(int)>& part) {
  if (parts <= 0) return;
  if (parts == 1) {
    part(0);
    return;
  }
  ThePool().Run(parts, part);
}

void ParallelFor(int64_t threads, int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const int64_t parts = std::clamp<int64_t>(threads, 1, n), per = (n + parts - 1) / parts;
  ParallelRun(static_cast<int>(parts), [&](int t) {
    const int64_t begin = std::min(n, t * per), end = std::min(n, begin + per);
    if (begin < end) body(begin, end);
  });
}

}  // namespace ringmaster::kernels
