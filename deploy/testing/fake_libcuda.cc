// A stand-in for the NVIDIA driver's libcuda.so.1, for //deploy:deploy_test: a CUDA bundle's
// ringworker --gpus=required is run with it on LD_LIBRARY_PATH, as on a host whose driver is
// too old (FAKE_CUDA_DRIVER_VERSION=12080, FAKE_CUDA_INIT_RESULT=35) or that has no GPU
// (13000 and 100, CUDA_ERROR_NO_DEVICE). The CUDA runtime finds no other entry point it
// needs and fails as it does with such a driver; that is all the agent's probe gets to see.
#include <cstdlib>

namespace {

int FromEnvironment(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

}  // namespace

extern "C" int cuDriverGetVersion(int* version) {
  *version = FromEnvironment("FAKE_CUDA_DRIVER_VERSION", 13000);
  return 0;
}

extern "C" int cuInit(unsigned int) { return FromEnvironment("FAKE_CUDA_INIT_RESULT", 100); }
