#include "common/out_of_memory.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

namespace ringmaster {
namespace {

const char* g_program = "ringmaster";

[[noreturn]] void OnTerminate() {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      // No allocation from here on: the message is formatted into a fixed buffer.
      char line[512];
      const int n = snprintf(line, sizeof(line),
                             "%s: RESOURCE_EXHAUSTED: out of memory (std::bad_alloc on a "
                             "thread that could not report it); no restart can fix this: "
                             "make the model smaller, shard its state "
                             "(parallelism.zero_stage), or give the job larger nodes\n",
                             g_program);
      if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<size_t>(n));
      _exit(kExitCodePermanent);
    } catch (...) {
    }
  }
  std::abort();
}

}  // namespace

void InstallOutOfMemoryExit(const char* program) {
  g_program = program;
  std::set_terminate(OnTerminate);
}

}  // namespace ringmaster
