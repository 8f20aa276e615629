// A process's last word when memory runs out where no caller can be told: an uncaught
// std::bad_alloc on any thread (a background writer, a gradient-sync thread) would abort
// the process with a bare "terminate called..." that reads like a crash, and its supervisor
// would restart it into the same failure. InstallOutOfMemoryExit makes such a process print
// one line naming RESOURCE_EXHAUSTED and exit with kExitCodePermanent, which the coordinator
// takes as an error no restart can fix (coordinator/membership.h, TrainerExited). Any other
// uncaught exception still aborts as before.
#ifndef RINGMASTER_COMMON_OUT_OF_MEMORY_H_
#define RINGMASTER_COMMON_OUT_OF_MEMORY_H_

namespace ringmaster {

// The exit status of a process that met an error no restart can fix and could not report it
// otherwise. (0: done, 1: failed, 2: bad flags or spec.)
inline constexpr int kExitCodePermanent = 3;

// Installs the std::terminate handler described above; `program` names the process in the
// line it prints. Call once, early in main. Not thread-safe with other set_terminate calls.
void InstallOutOfMemoryExit(const char* program);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_OUT_OF_MEMORY_H_
