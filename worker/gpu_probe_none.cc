// ProbeGpus in a build without --config=cuda: there is no CUDA runtime to ask.
#include "worker/gpu_check.h"

namespace ringmaster::worker {

GpuProbe ProbeGpus() { return GpuProbe{}; }

}  // namespace ringmaster::worker
